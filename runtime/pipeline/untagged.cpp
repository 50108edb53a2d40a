// untagged_batches() and validate_untagged(): a schedule's point-to-point actions as a backend
// without message tags (NCCL) runs them (pipeline_schedule.h).
#include <tandem/runtime/pipeline_schedule.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

namespace tandem::pipeline {

namespace {

[[noreturn]] void fail(const Schedule& s, const std::string& what, int rank, int step) {
  std::ostringstream msg;
  msg << "pipeline schedule '" << s.name << "' (" << s.num_ranks << " ranks, " << s.num_stages
      << " stages, " << s.num_microbatches << " microbatches) cannot run over a backend without "
      << "message tags (NCCL): " << what << " [rank " << rank << ", step " << step
      << ", marked >>]. Lower it with lower_untagged(), or use CPU tensors over Gloo (which "
      << "matches messages by tag)\n"
      << s.grid(rank, step);
  throw ScheduleError(msg.str());
}

struct Message {  // which tensor: forward (0) or backward (1), its producing stage, microbatch
  int kind, stage, microbatch;
  bool operator==(const Message& o) const {
    return kind == o.kind && stage == o.stage && microbatch == o.microbatch;
  }
};

std::string describe(const Message& m) {
  return std::string(m.kind == 0 ? "the activation " : "the input gradient ") +
         std::to_string(m.stage) + ":" + std::to_string(m.microbatch);
}

// One SEND or RECV of a rank: its peer, its message, and where it sits.
struct P2P {
  bool send;
  int peer;
  Message message;
  int batch, step;
};

P2P p2p_of(const Schedule& s, const Action& a, int batch, int step) {
  const bool forward = a.op == Op::kSendForward || a.op == Op::kRecvForward;
  const bool send = a.op == Op::kSendForward || a.op == Op::kSendBackward;
  // A SEND names the producing stage's rank as its own; the peer holds the neighbour stage.
  int peer;
  if (forward) {
    peer = send ? s.stage_to_rank[a.stage + 1] : s.stage_to_rank[a.stage];
  } else {
    peer = send ? s.stage_to_rank[a.stage - 1] : s.stage_to_rank[a.stage];
  }
  return {send, peer, {forward ? 0 : 1, a.stage, a.microbatch}, batch, step};
}

}  // namespace

Schedule lower_untagged(const Schedule& schedule) {
  Schedule in = schedule;  // its compute actions: a lowered schedule's comm actions go
  for (auto& list : in.actions) {
    list.erase(std::remove_if(list.begin(), list.end(), [](const Action& a) { return is_comm(a.op); }),
               list.end());
  }
  Schedule out = in;
  const int R = in.num_ranks, S = in.num_stages;
  for (auto& list : out.actions) list.clear();
  auto rank_of = [&](int stage) { return in.stage_to_rank[stage]; };
  // (kind, stage, microbatch) that arrived on each rank: 0 an activation, 1 an input gradient.
  std::vector<std::map<std::tuple<int, int, int>, bool>> arrived(R);
  auto ready = [&](int r, const Action& a) {
    const int s = a.stage, k = a.microbatch;
    if (a.op == Op::kForward && s > 0 && rank_of(s - 1) != r) return arrived[r].count({0, s - 1, k}) > 0;
    const bool backward = a.op == Op::kBackward || a.op == Op::kBackwardInput;
    if (backward && s + 1 < S && rank_of(s + 1) != r) return arrived[r].count({1, s + 1, k}) > 0;
    return true;
  };
  std::vector<size_t> next(R, 0);
  for (bool left = true; left;) {
    left = false;
    bool progress = false;
    for (int r = 0; r < R; ++r) {  // one compute action per rank per turn, ranks in order
      if (next[r] >= in.actions[r].size()) continue;
      left = true;
      const Action& a = in.actions[r][next[r]];
      if (!ready(r, a)) continue;
      out.actions[r].push_back(a);
      const int s = a.stage, k = a.microbatch;
      const bool backward = a.op == Op::kBackward || a.op == Op::kBackwardInput;
      // A send and its receive enter both lists now: every rank posts in one global order.
      if (a.op == Op::kForward && s + 1 < S && rank_of(s + 1) != r) {
        out.actions[r].push_back({Op::kSendForward, s, k});
        out.actions[rank_of(s + 1)].push_back({Op::kRecvForward, s, k});
        arrived[rank_of(s + 1)][{0, s, k}] = true;
      } else if (backward && s > 0 && rank_of(s - 1) != r) {
        out.actions[r].push_back({Op::kSendBackward, s, k});
        out.actions[rank_of(s - 1)].push_back({Op::kRecvBackward, s, k});
        arrived[rank_of(s - 1)][{1, s, k}] = true;
      }
      ++next[r];
      progress = true;
    }
    if (left && !progress) {
      throw ScheduleError("pipeline schedule '" + in.name + "': no rank can run its next action "
                          "(each waits for an input nobody sends first): the schedule is "
                          "malformed; validate() says where\n" + in.grid());
    }
  }
  return out;
}

std::vector<std::vector<std::vector<int>>> untagged_batches(const Schedule& s) {
  std::vector<std::vector<std::vector<int>>> batches(s.actions.size());
  for (size_t r = 0; r < s.actions.size(); ++r) {
    bool open = false;
    for (int j = 0; j < static_cast<int>(s.actions[r].size()); ++j) {
      if (!is_comm(s.actions[r][j].op)) {
        open = false;
        continue;
      }
      if (!open) batches[r].emplace_back();
      batches[r].back().push_back(j);
      open = true;
    }
  }
  return batches;
}

void validate_untagged(const Schedule& schedule) {
  validate(schedule);
  const Schedule s = schedule.lowered() ? schedule : lower_untagged(schedule);
  const auto batches = untagged_batches(s);
  const int R = s.num_ranks;
  // Every rank's ops in posting order, and each directed pair's sends and receives.
  std::vector<std::vector<P2P>> ops(R);
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sends, recvs;  // -> (rank, op)
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < static_cast<int>(batches[r].size()); ++b) {
      for (int j : batches[r][b]) {
        const P2P p = p2p_of(s, s.actions[r][j], b, j);
        (p.send ? sends[{r, p.peer}] : recvs[{p.peer, r}]).emplace_back(r, static_cast<int>(ops[r].size()));
        ops[r].push_back(p);
      }
    }
  }
  // Without tags the n-th send from a to b is the n-th receive on b from a: the same message.
  std::vector<std::vector<std::pair<int, int>>> match(R);  // (rank, op) of each op's partner
  for (int r = 0; r < R; ++r) match[r].assign(ops[r].size(), {-1, -1});
  for (const auto& [pair, list] : sends) {
    const auto& other = recvs[pair];
    for (size_t n = 0; n < list.size(); ++n) {
      const P2P& send = ops[list[n].first][list[n].second];
      if (n >= other.size()) fail(s, "a send has no receive", list[n].first, send.step);
      const P2P& recv = ops[other[n].first][other[n].second];
      if (!(send.message == recv.message)) {
        fail(s, "rank " + std::to_string(pair.first) + " sends " + describe(send.message) +
                    " as its message #" + std::to_string(n) + " to rank " +
                    std::to_string(pair.second) + ", which receives " + describe(recv.message) +
                    " as its #" + std::to_string(n) + " from it: a pair's messages must come in "
                    "the same order on both sides",
             other[n].first, recv.step);
      }
      match[list[n].first][list[n].second] = other[n];
      match[other[n].first][other[n].second] = list[n];
    }
  }
  // Run the batches: each rank's in order; an op completes once its partner's batch is posted
  // (the current one of that rank), and a batch once all of its ops did.
  std::vector<size_t> current(R, 0);
  std::vector<std::vector<char>> done(R);
  for (int r = 0; r < R; ++r) done[r].assign(ops[r].size(), 0);
  std::vector<size_t> first(R, 0);  // index of the current batch's first op
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      if (current[r] >= batches[r].size()) continue;
      bool all = true;
      size_t k = first[r];
      for (; k < ops[r].size() && ops[r][k].batch == static_cast<int>(current[r]); ++k) {
        if (done[r][k]) continue;
        const auto [peer, op] = match[r][k];
        if (current[peer] < batches[peer].size() &&
            ops[peer][op].batch == static_cast<int>(current[peer])) {
          done[r][k] = done[peer][op] = 1;
          progress = true;
        } else {
          all = false;
        }
      }
      if (all) {
        ++current[r];
        first[r] = k;
        progress = true;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    if (current[r] >= batches[r].size()) continue;
    const P2P& stuck = ops[r][first[r]];
    std::ostringstream what;
    what << "deadlock: rank " << r << "'s batch of point-to-point ops from step " << stuck.step
         << " waits for a peer whose own batch waits first";
    fail(s, what.str(), r, stuck.step);
  }
}

}  // namespace tandem::pipeline
