// validate(): the rules of pipeline_schedule.h, each failure shown on the step x rank grid.
#include <tandem/runtime/pipeline_schedule.h>

#include <map>
#include <sstream>
#include <tuple>

namespace tandem::pipeline {

namespace {

[[noreturn]] void fail(const Schedule& s, const std::string& what, int rank = -1, int step = -1) {
  std::ostringstream msg;
  msg << "invalid pipeline schedule '" << s.name << "' (" << s.num_ranks << " ranks, "
      << s.num_stages << " stages, " << s.num_microbatches << " microbatches): " << what;
  if (rank >= 0 && step >= 0) msg << " [rank " << rank << ", step " << step << ", marked >>]";
  msg << "\n" << s.grid(rank, step);
  throw ScheduleError(msg.str());
}

using Key = std::tuple<int, int, int>;  // op, stage, microbatch

void check_structure(const Schedule& s) {
  if (s.num_ranks < 1 || s.num_stages < 1 || s.num_microbatches < 1) {
    fail(s, "ranks, stages and microbatches must all be >= 1");
  }
  if (static_cast<int>(s.actions.size()) != s.num_ranks) {
    fail(s, "has action lists for " + std::to_string(s.actions.size()) + " ranks, expected " +
                std::to_string(s.num_ranks));
  }
  if (static_cast<int>(s.stage_to_rank.size()) != s.num_stages) {
    fail(s, "stage_to_rank has " + std::to_string(s.stage_to_rank.size()) + " entries, expected " +
                std::to_string(s.num_stages));
  }
  for (int st = 0; st < s.num_stages; ++st) {
    if (s.stage_to_rank[st] < 0 || s.stage_to_rank[st] >= s.num_ranks) {
      fail(s, "stage " + std::to_string(st) + " is mapped to rank " +
                  std::to_string(s.stage_to_rank[st]) + ", outside [0, " +
                  std::to_string(s.num_ranks) + ")");
    }
  }
  for (int r = 0; r < s.num_ranks; ++r) {
    if (s.stages_of(r).empty()) fail(s, "rank " + std::to_string(r) + " holds no stage");
  }
  const int S = s.num_stages;
  for (int r = 0; r < s.num_ranks; ++r) {
    for (int j = 0; j < static_cast<int>(s.actions[r].size()); ++j) {
      const Action& a = s.actions[r][j];
      if (a.stage < 0 || a.stage >= S) fail(s, "stage index out of range", r, j);
      if (a.microbatch < 0 || a.microbatch >= s.num_microbatches) {
        fail(s, "microbatch index out of range", r, j);
      }
      int owner = -1;  // the stage whose rank must run this action
      switch (a.op) {
        case Op::kSendForward:
          if (a.stage == S - 1) fail(s, "the last stage sends no activation", r, j);
          owner = a.stage;
          break;
        case Op::kRecvForward:
          if (a.stage == S - 1) fail(s, "the last stage sends no activation", r, j);
          owner = a.stage + 1;
          break;
        case Op::kSendBackward:
          if (a.stage == 0) fail(s, "the first stage sends no input gradient", r, j);
          owner = a.stage;
          break;
        case Op::kRecvBackward:
          if (a.stage == 0) fail(s, "the first stage sends no input gradient", r, j);
          owner = a.stage - 1;
          break;
        default:
          owner = a.stage;
      }
      if (s.stage_to_rank[owner] != r) {
        fail(s, to_string(a) + " belongs to rank " + std::to_string(s.stage_to_rank[owner]), r, j);
      }
      if (is_comm(a.op)) {
        const int other = (a.op == Op::kSendForward)    ? s.stage_to_rank[a.stage + 1]
                          : (a.op == Op::kRecvForward)  ? s.stage_to_rank[a.stage]
                          : (a.op == Op::kSendBackward) ? s.stage_to_rank[a.stage - 1]
                                                        : s.stage_to_rank[a.stage];
        if (other == r)
          fail(s, to_string(a) + " communicates between stages on the same rank", r, j);
      }
    }
  }
}

void check_compute(const Schedule& s) {
  const int S = s.num_stages, M = s.num_microbatches;
  // Positions of compute actions per rank.
  std::map<Key, std::pair<int, int>> where;  // key -> (rank, step)
  for (int r = 0; r < s.num_ranks; ++r) {
    for (int j = 0; j < static_cast<int>(s.actions[r].size()); ++j) {
      const Action& a = s.actions[r][j];
      const Key key{static_cast<int>(a.op), a.stage, a.microbatch};
      if (where.count(key)) fail(s, to_string(a) + " appears twice", r, j);
      where[key] = {r, j};
    }
  }
  auto pos = [&](Op op, int st, int k) {
    auto it = where.find(Key{static_cast<int>(op), st, k});
    return it == where.end() ? -1 : it->second.second;
  };
  for (int st = 0; st < S; ++st) {
    const int r = s.stage_to_rank[st];
    for (int k = 0; k < M; ++k) {
      const std::string id = std::to_string(st) + ":" + std::to_string(k);
      const int f = pos(Op::kForward, st, k), b = pos(Op::kBackward, st, k);
      const int i = pos(Op::kBackwardInput, st, k), w = pos(Op::kBackwardWeight, st, k);
      if (f < 0) fail(s, "missing F" + id + " (every stage runs every microbatch forward once)");
      if (b >= 0 && (i >= 0 || w >= 0)) {
        fail(s,
             "stage " + std::to_string(st) + " microbatch " + std::to_string(k) +
                 " has both B and I/W",
             r, b);
      }
      if (b < 0 && i < 0) fail(s, "missing B" + id + " (or I" + id + " + W" + id + ")");
      if (i >= 0 && w < 0) fail(s, "I" + id + " has no matching W" + id, r, i);
      if (w >= 0 && i < 0) fail(s, "W" + id + " has no matching I" + id, r, w);
      const int back = b >= 0 ? b : i;
      if (back < f) fail(s, "backward of " + id + " runs before its forward F" + id, r, back);
      if (w >= 0 && w < i) fail(s, "W" + id + " runs before I" + id, r, w);
      // Stages on the same rank: local data dependencies are ordering constraints.
      if (st > 0 && s.stage_to_rank[st - 1] == r) {
        const int prev = pos(Op::kForward, st - 1, k);
        if (prev > f)
          fail(s,
               "F" + id + " runs before F" + std::to_string(st - 1) + ":" + std::to_string(k) +
                   " on the same rank",
               r, f);
      }
      if (st + 1 < S && s.stage_to_rank[st + 1] == r) {
        int next = pos(Op::kBackward, st + 1, k);
        if (next < 0) next = pos(Op::kBackwardInput, st + 1, k);
        if (next > back)
          fail(s,
               "backward of " + id + " runs before the backward of stage " +
                   std::to_string(st + 1) + " on the same rank",
               r, back);
      }
    }
  }
}

void check_comm(const Schedule& s) {
  const int S = s.num_stages, M = s.num_microbatches;
  std::map<Key, std::pair<int, int>> where;
  for (int r = 0; r < s.num_ranks; ++r) {
    for (int j = 0; j < static_cast<int>(s.actions[r].size()); ++j) {
      const Action& a = s.actions[r][j];
      where[Key{static_cast<int>(a.op), a.stage, a.microbatch}] = {r, j};
    }
  }
  auto find = [&](Op op, int st, int k) {
    auto it = where.find(Key{static_cast<int>(op), st, k});
    return it == where.end() ? std::pair<int, int>{-1, -1} : it->second;
  };
  auto backward_of = [&](int st, int k) {
    auto b = find(Op::kBackward, st, k);
    return b.first >= 0 ? b : find(Op::kBackwardInput, st, k);
  };
  size_t needed = 0;
  for (int st = 0; st < S; ++st) {
    for (int k = 0; k < M; ++k) {
      const std::string id = std::to_string(st) + ":" + std::to_string(k);
      if (st + 1 < S && s.stage_to_rank[st] != s.stage_to_rank[st + 1]) {
        needed += 2;
        const auto producer = find(Op::kForward, st, k);
        const auto consumer = find(Op::kForward, st + 1, k);
        const auto send = find(Op::kSendForward, st, k);
        const auto recv = find(Op::kRecvForward, st, k);
        if (send.first < 0)
          fail(s, "missing SEND_F" + id + " after F" + id, producer.first, producer.second);
        if (recv.first < 0)
          fail(s,
               "missing RECV_F" + id + " before F" + std::to_string(st + 1) + ":" +
                   std::to_string(k),
               consumer.first, consumer.second);
        if (send.second < producer.second)
          fail(s, "SEND_F" + id + " before the F that produces it", send.first, send.second);
        if (recv.second > consumer.second)
          fail(s, "RECV_F" + id + " after the F that uses it", recv.first, recv.second);
      }
      if (st > 0 && s.stage_to_rank[st] != s.stage_to_rank[st - 1]) {
        needed += 2;
        const auto producer = backward_of(st, k);
        const auto consumer = backward_of(st - 1, k);
        const auto send = find(Op::kSendBackward, st, k);
        const auto recv = find(Op::kRecvBackward, st, k);
        if (send.first < 0)
          fail(s, "missing SEND_B" + id + " after the backward of " + id, producer.first,
               producer.second);
        if (recv.first < 0)
          fail(s, "missing RECV_B" + id + " before the backward of stage " + std::to_string(st - 1),
               consumer.first, consumer.second);
        if (send.second < producer.second)
          fail(s, "SEND_B" + id + " before the backward that produces it", send.first, send.second);
        if (recv.second > consumer.second)
          fail(s, "RECV_B" + id + " after the backward that uses it", recv.first, recv.second);
      }
    }
  }
  // Every comm action is one of the needed ones (duplicates were rejected by check_compute).
  size_t comm = 0;
  for (int r = 0; r < s.num_ranks; ++r) {
    for (const auto& a : s.actions[r]) comm += is_comm(a.op) ? 1 : 0;
  }
  if (comm != needed)
    fail(s, std::to_string(comm) + " SEND/RECV actions where " + std::to_string(needed) +
                " are needed");

  // Deadlock: execute with asynchronous sends and blocking receives.
  std::vector<size_t> pc(s.num_ranks, 0);
  std::map<Key, bool> sent;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < s.num_ranks; ++r) {
      while (pc[r] < s.actions[r].size()) {
        const Action& a = s.actions[r][pc[r]];
        if (a.op == Op::kSendForward || a.op == Op::kSendBackward) {
          sent[Key{static_cast<int>(a.op), a.stage, a.microbatch}] = true;
        } else if (a.op == Op::kRecvForward || a.op == Op::kRecvBackward) {
          const Op send_op = a.op == Op::kRecvForward ? Op::kSendForward : Op::kSendBackward;
          if (!sent.count(Key{static_cast<int>(send_op), a.stage, a.microbatch})) break;
        }
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.num_ranks; ++r) {
    if (pc[r] < s.actions[r].size()) {
      const Action& a = s.actions[r][pc[r]];
      const Op send_op = a.op == Op::kRecvForward ? Op::kSendForward : Op::kSendBackward;
      const auto send = find(send_op, a.stage, a.microbatch);
      std::ostringstream what;
      what << "deadlock: rank " << r << " waits at step " << pc[r] << " on " << to_string(a)
           << ", whose send (rank " << send.first << " step " << send.second
           << ") is queued behind a receive that never completes";
      fail(s, what.str(), r, static_cast<int>(pc[r]));
    }
  }
}

}  // namespace

void validate(const Schedule& schedule) {
  check_structure(schedule);
  check_compute(schedule);
  if (schedule.lowered()) {
    check_comm(schedule);
  } else {
    check_comm(lower(schedule));
  }
}

}  // namespace tandem::pipeline
