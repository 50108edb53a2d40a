#include "tools/tandemrun/elastic/rendezvous.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include "base/strings.h"
#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/launch/free_port.h"
#include "tools/tandemrun/launch/worker_status.h"

namespace tandem::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using strings::split_words;

// How often a waiting agent looks at the store.
constexpr std::chrono::milliseconds kPollInterval{50};
// How long a reader waits for the details of a failure whose counter it saw.
constexpr std::chrono::seconds kDetailsWait{5};

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

std::optional<long long> parse_number(const std::string& text) {
  const auto v = strings::parse_int(text);
  if (!v) return std::nullopt;
  return static_cast<long long>(*v);
}

std::string round_key(int round, const std::string& suffix) {
  return "r/" + std::to_string(round) + "/" + suffix;
}

}  // namespace

Rendezvous::JoinOutcome Rendezvous::join(int min_round, const std::function<bool()>& interrupted,
                                         Round* round, std::string* status) {
  auto deadline = Clock::now() + millis(options_.rdzv_join_timeout_s);
  for (;;) {
    const auto open = store_.try_get("open_round");
    int r = std::max<int>(min_round, open ? static_cast<int>(parse_number(*open).value_or(0)) : 0);
    const std::string rk = round_key(r, "");
    const long long slot = store_.counter(rk + "joined", 1);
    const int port = pick_free_port(store_.local_addr());
    const std::string fields = agent_id() + " " + store_.local_addr() + " " +
                               std::to_string(port) + " " +
                               std::to_string(options_.nproc_per_node) + " " +
                               std::to_string(options_.node_rank_given ? options_.node_rank
                                                                       : last_node_rank_);
    store_.put(rk + "node/" + std::to_string(slot), fields + " " + store_.record_digest(fields));
    std::optional<Clock::time_point> min_seen;
    for (;;) {
      check_store();
      if (interrupted()) return JoinOutcome::kInterrupted;
      if (const auto state = job_state())
        return *state ? JoinOutcome::kJobSucceeded : JoinOutcome::kJobFailed;
      if (const auto members = read_members(r)) {
        const auto self =
            std::find_if(members->begin(), members->end(),
                         [&](const RoundMember& m) { return m.agent_id == agent_id(); });
        if (self == members->end()) break;  // closed without us: wait for the next restart
        round->number = r;
        round->node_rank = self->node_rank;
        last_node_rank_ = self->node_rank;  // asked for again next round: ranks stay stable
        round->members = *members;
        const RoundMember* store_node = &members->front();
        if (options_.ft) {
          const auto host = store_.try_get("host");
          for (const auto& m : *members) {
            if (host && m.agent_id == *host) store_node = &m;
          }
        }
        round->master_addr = store_node->addr;
        round->master_port = store_node->free_port;
        round->serves_workers_store = options_.ft && store_node->agent_id == agent_id();
        return JoinOutcome::kJoined;
      }
      const long long joined = store_.counter(rk + "joined", 0);
      if (joined >= options_.min_nodes && !min_seen) min_seen = Clock::now();
      const bool last_call_over =
          min_seen && Clock::now() - *min_seen >= millis(options_.rdzv_last_call_s);
      if (joined >= options_.max_nodes || last_call_over) {
        if (try_close(r)) continue;
      }
      if (Clock::now() >= deadline) {
        *status = "round " + std::to_string(r) + " has " + std::to_string(joined) +
                  " of at least " + std::to_string(options_.min_nodes) + " nodes after " +
                  seconds_text(options_.rdzv_join_timeout_s) + " (--rdzv-join-timeout-s)";
        return JoinOutcome::kTimedOut;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    log_line("round " + std::to_string(r) + " of the rendezvous at " + endpoint() +
             " closed without this node (it runs already); waiting for the next restart to join");
    // Wait (without a deadline: the job may run for long) until a restart opens a later round.
    for (;;) {
      check_store();
      if (interrupted()) return JoinOutcome::kInterrupted;
      if (const auto state = job_state())
        return *state ? JoinOutcome::kJobSucceeded : JoinOutcome::kJobFailed;
      const auto now_open = store_.try_get("open_round");
      if (now_open && parse_number(*now_open).value_or(0) > r) break;
      std::this_thread::sleep_for(kPollInterval);
    }
    min_round = r + 1;
    deadline = Clock::now() + millis(options_.rdzv_join_timeout_s);
  }
}

bool Rendezvous::try_close(int r) {
  const std::string rk = round_key(r, "");
  if (store_.counter(rk + "closed", 1) != 1) return false;  // another agent closes it
  // Joins counted after this read wait for the next round (they see they are not members).
  const long long count =
      std::min<long long>(store_.counter(rk + "joined", 0), options_.max_nodes);
  struct Candidate {
    long long slot;
    int requested;
  };
  std::vector<Candidate> valid;
  for (long long slot = 1; slot <= count; ++slot) {
    const std::string node_key = rk + "node/" + std::to_string(slot);
    const auto give_up = Clock::now() + kDetailsWait;
    std::optional<std::string> record;
    while (!(record = store_.try_get(node_key)) && Clock::now() < give_up)
      std::this_thread::sleep_for(kPollInterval);
    const auto words = record ? split_words(*record) : std::vector<std::string>{};
    bool ok = words.size() == 6 && std::all_of(words.begin(), words.end(), is_word);
    if (ok) {
      const std::string fields =
          words[0] + " " + words[1] + " " + words[2] + " " + words[3] + " " + words[4];
      ok = words[5] == store_.record_digest(fields) && parse_number(words[2]) &&
           parse_number(words[3]) && parse_number(words[4]);
    }
    if (!ok) {
      log_line("rendezvous round " + std::to_string(r) + ": ignoring joiner " +
               std::to_string(slot) + " (" + (record ? "its job token differs" : "no record") +
               ")");
      continue;
    }
    valid.push_back({slot, static_cast<int>(*parse_number(words[4]))});
  }
  // Nodes that asked for a rank (--node-rank, or their rank in the previous round) come first, in
  // that order; newcomers follow in join order.
  std::stable_sort(valid.begin(), valid.end(), [](const Candidate& a, const Candidate& b) {
    const int ra = a.requested >= 0 ? a.requested : INT_MAX;
    const int rb = b.requested >= 0 ? b.requested : INT_MAX;
    return ra != rb ? ra < rb : a.slot < b.slot;
  });
  std::string members;
  for (const auto& c : valid) members += (members.empty() ? "" : " ") + std::to_string(c.slot);
  store_.put(rk + "members", members.empty() ? "none" : members);
  return true;
}

std::optional<std::vector<RoundMember>> Rendezvous::read_members(int r) {
  const std::string rk = round_key(r, "");
  const auto members = store_.try_get(rk + "members");
  if (!members) return std::nullopt;
  std::vector<RoundMember> out;
  for (const auto& slot : split_words(*members)) {
    if (slot == "none") break;
    const auto record = store_.try_get(rk + "node/" + slot);
    const auto words = record ? split_words(*record) : std::vector<std::string>{};
    if (words.size() != 6 || !parse_number(words[2]) || !parse_number(words[3])) {
      throw RendezvousError("the rendezvous at " + endpoint() + " holds a malformed record for "
                            "round " + std::to_string(r) + " node " + printable(slot));
    }
    RoundMember m;
    m.node_rank = static_cast<int>(out.size());
    m.agent_id = words[0];
    m.addr = words[1];
    m.free_port = static_cast<int>(*parse_number(words[2]));
    m.nproc = static_cast<int>(*parse_number(words[3]));
    out.push_back(m);
  }
  return out;
}

std::optional<RoundFailure> Rendezvous::failure(int r) {
  const std::string fk = round_key(r, "failure");
  const auto head = store_.try_get(fk);
  if (!head) return std::nullopt;
  const auto words = split_words(*head);
  RoundFailure f;
  f.round = r;
  if (words.size() == 4) {
    f.node_rank = static_cast<int>(parse_number(words[0]).value_or(-1));
    f.rank = static_cast<int>(parse_number(words[1]).value_or(-1));
    f.pid = static_cast<long>(parse_number(words[2]).value_or(-1));
    f.node_lost = words[3] == "1";
  }
  f.host = printable(store_.try_get(fk + "_host").value_or("?"));
  f.what = printable(store_.try_get(fk + "_what").value_or("failed"));
  f.error = printable(store_.try_get(fk + "_error").value_or(""));
  f.final_reason = printable(store_.try_get(fk + "_final").value_or(""));
  return f;
}

RoundFailure Rendezvous::report_failure(const RoundFailure& f) {
  const std::string fk = round_key(f.round, "failure");
  if (store_.counter(fk + "_count", 1) == 1) {
    store_.put(fk + "_host", f.host);
    store_.put(fk + "_what", f.what);
    store_.put(fk + "_error", f.error);
    store_.put(fk + "_final", f.final_reason);
    // Written last: a reader that sees it finds the details.
    store_.put(fk, std::to_string(f.node_rank) + " " + std::to_string(f.rank) + " " +
                std::to_string(f.pid) + " " + (f.node_lost ? "1" : "0"));
    return f;
  }
  const auto give_up = Clock::now() + kDetailsWait;
  while (Clock::now() < give_up) {
    if (auto first = failure(f.round)) return *first;
    std::this_thread::sleep_for(kPollInterval);
  }
  return f;  // the first reporter died before writing its report
}

std::vector<RoundMember> Rendezvous::lost_members(const Round& round) {
  std::vector<RoundMember> lost;
  for (const auto& m : round.members) {
    if (m.agent_id != agent_id() && store_.stale(m.agent_id)) lost.push_back(m);
  }
  return lost;
}

void Rendezvous::open_round(int number) { store_.put("open_round", std::to_string(number)); }

int Rendezvous::report_success(int r) {
  return static_cast<int>(store_.counter(round_key(r, "succeeded"), 1));
}

int Rendezvous::successes(int r) {
  return static_cast<int>(store_.counter(round_key(r, "succeeded"), 0));
}

void Rendezvous::set_job_state(bool succeeded) {
  store_.put("state", succeeded ? "succeeded" : "failed");
}

std::optional<bool> Rendezvous::job_state() {
  const auto state = store_.try_get("state");
  if (!state) return std::nullopt;
  return *state == "succeeded";
}

}  // namespace tandem::launcher
