#include "tools/tandemrun/elastic/elastic_agent.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <tandem/base/errors.h>

#include "base/launch_contract.h"
#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/ft/ft_reporter.h"
#include "tools/tandemrun/elastic/job_token.h"
#include "tools/tandemrun/elastic/rendezvous.h"
#include "tools/tandemrun/supervise/root_cause.h"
#include "tools/tandemrun/report/run_summary.h"
#include "tools/tandemrun/launch/signal_relay.h"
#include "tools/tandemrun/launch/worker_group.h"
#include "tools/tandemrun/launch/worker_status.h"

namespace tandem::launcher {
namespace {

using launch::kExitFailed;  // the launch contract's exit codes (base/launch_contract.h)
using launch::kExitFinal;   // a failure no restart can fix, as on one node
constexpr int kExitUsage = launch::kExitFinal;
constexpr std::chrono::milliseconds kHookInterval{100};
constexpr std::chrono::milliseconds kPoll{50};

std::string describe(const RoundFailure& f) {
  if (f.node_lost) return "node " + std::to_string(f.node_rank) + " (" + f.host + ") " + f.what;
  std::string text = "rank " + std::to_string(f.rank) + " on node " + std::to_string(f.node_rank) +
                     " (host " + f.host + ", pid " + std::to_string(f.pid) + ") " + f.what;
  if (!f.error.empty()) text += ": " + f.error;
  return text;
}

// The root cause block, the same on every node: it comes from the rendezvous, not local memory.
void print_job_root_cause(Rendezvous& rdzv, int last_round, int max_restarts) {
  std::vector<RoundFailure> failures;
  for (int r = 0; r <= last_round; ++r) {
    if (auto f = rdzv.failure(r)) failures.push_back(*f);
  }
  if (failures.empty()) return;
  const RoundFailure& first = failures.front();
  std::ostringstream out;
  if (first.node_lost) {
    out << "tandemrun: root cause (first failure): node " << first.node_rank << " (host "
        << first.host << ") " << first.what << "; restart " << first.round << "\n";
  } else {
    out << "tandemrun: root cause (first failure): rank " << first.rank << " on node "
        << first.node_rank << " (host " << first.host << ", pid " << first.pid << "), restart "
        << first.round << ": " << first.what << "\n";
    if (!first.error.empty()) out << "tandemrun:   error: " << first.error << "\n";
  }
  if (max_restarts > 0 || failures.size() > 1) {
    out << "tandemrun: failures: " << failures.size()
        << (failures.size() == 1 ? " round" : " rounds") << " (--max-restarts " << max_restarts
        << ", counted for the whole job)\n";
    for (const auto& f : failures)
      out << "tandemrun:   restart " << f.round << ": " << describe(f) << "\n";
  }
  write_all(2, out.str());
}

RoundFailure lost_node_failure(int round, const RoundMember& m, double node_timeout_s) {
  RoundFailure f;
  f.round = round;
  f.node_rank = m.node_rank;
  f.host = m.addr;
  f.node_lost = true;
  f.what = "was lost: its agent renewed no keep-alive for " + seconds_text(node_timeout_s) +
           " (killed, or its host is down)";
  return f;
}

class Agent {
 public:
  Agent(LauncherOptions options, std::vector<std::string> env, std::string token)
      : options_(std::move(options)),
        rdzv_(options_, std::move(token)),
        group_(options_, std::move(env), signals_) {}

  int run();

 private:
  bool interrupted();
  int finish(int status) {
    if (rdzv_.is_host()) rdzv_.linger();  // the others still read the store
    return status;
  }
  // After this node's workers failed on their own: the failure that counts for the round.
  RoundFailure handle_local_failure(const Round& round, const MonitorResult& result);
  // This node's workers succeeded: waits for the other nodes' outcome.
  std::optional<RoundFailure> wait_for_round(const Round& round, bool* all_succeeded);
  // --ft: a lost node does not end the round; its ranks drop out at the workers' next quorum.
  void note_lost(const Round& round, const std::vector<RoundMember>& lost);

  SignalRelay signals_;  // first: the group polls it
  LauncherOptions options_;
  Rendezvous rdzv_;
  WorkerGroup group_;
  int stop_signal_ = 0;
  std::chrono::milliseconds grace_{0};
  std::unique_ptr<FtReporter> ft_;  // --ft: this round's workers' store
  FtTally tally_;
  std::set<std::string> noted_lost_;  // agent ids
};

void Agent::note_lost(const Round& round, const std::vector<RoundMember>& lost) {
  for (const RoundMember& m : lost) {
    if (!noted_lost_.insert(m.agent_id).second) continue;
    const int first = m.node_rank * options_.nproc_per_node;
    ft_->report_lost_ranks(first, m.nproc, round.number, "its node " + m.addr + " was lost");
    log_line("node " + std::to_string(m.node_rank) + " (" + m.addr + ") was lost: its agent renewed "
             "no keep-alive for " + seconds_text(options_.rdzv_node_timeout_s) + "; its ranks " +
             std::to_string(first) + "-" + std::to_string(first + m.nproc - 1) +
             " drop out at the workers' next quorum and the others go on (--ft, round " +
             std::to_string(round.number) + ")");
  }
}

bool Agent::interrupted() {
  pollfd p{signals_.fd(), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) {
    const ReceivedSignals received = signals_.drain();
    if (stop_signal_ == 0 && !received.stop_signals.empty())
      stop_signal_ = received.stop_signals.front();
  }
  return stop_signal_ != 0;
}

RoundFailure Agent::handle_local_failure(const Round& round, const MonitorResult& result) {
  const Worker& first_seen = group_.workers()[static_cast<std::size_t>(result.failed_local_rank)];
  log_line("rank " + std::to_string(first_seen.rank) + " " +
           describe_failure(first_seen, options_.heartbeat_timeout_s) +
           "; stopping this node's workers (SIGTERM, SIGKILL after " +
           seconds_text(options_.grace_period_s) + ")");
  std::optional<RoundFailure> elsewhere;
  const auto error = launch::read_error_file(first_seen.error_file);
  if (error && looks_secondary(*error)) {
    // A peer went away: the cause may be on this node (a worker still failing) or on another
    // (a failure report, or a node whose keep-alive stops). Wait a bounded time to learn which.
    const auto limit = std::chrono::milliseconds(
                           std::llround(options_.rdzv_node_timeout_s * 1000.0)) +
                       std::chrono::seconds(1);
    const auto end = std::chrono::steady_clock::now() + limit;
    auto local_cause = [this] {
      for (const auto& w : group_.workers()) {
        if (!w.failed_on_its_own()) continue;
        const auto e = launch::read_error_file(w.error_file);
        if (!e || !looks_secondary(*e)) return true;
      }
      return false;
    };
    while (std::chrono::steady_clock::now() < end && !local_cause()) {
      if ((elsewhere = rdzv_.failure(round.number))) break;
      const auto lost = rdzv_.lost_members(round);
      if (!lost.empty()) {
        elsewhere = lost_node_failure(round.number, lost.front(), options_.rdzv_node_timeout_s);
        break;
      }
      group_.settle(kHookInterval, local_cause);  // returns at once when all have exited
      if (group_.received_stop_signal() != 0) break;
      const auto& ws = group_.workers();
      if (std::all_of(ws.begin(), ws.end(), [](const Worker& w) { return w.exit.has_value(); }))
        std::this_thread::sleep_for(kPoll);
    }
  }
  group_.request_flight_dumps(round.number, std::chrono::milliseconds(3000));
  group_.stop(SIGTERM, grace_);
  if (elsewhere) return rdzv_.report_failure(*elsewhere);
  const int root = root_cause_local_rank(group_.workers(), result.failed_local_rank);
  const Worker& failed = group_.workers()[static_cast<std::size_t>(root)];
  const FailureRecord record = record_failure(failed, round.number, options_.heartbeat_timeout_s);
  RoundFailure f;
  f.round = round.number;
  f.node_rank = round.node_rank;
  f.host = record.host;
  f.rank = record.rank;
  f.pid = record.pid;
  f.what = record.what;
  if (record.error) f.error = record.error->message;
  f.final_reason = record.final_reason;
  if (group_.workers().size() > 1 || options_.max_restarts <= round.number)
    print_failure_summary(group_.workers(), root, options_.grace_period_s);
  return rdzv_.report_failure(f);
}

std::optional<RoundFailure> Agent::wait_for_round(const Round& round, bool* all_succeeded) {
  *all_succeeded = false;
  for (;;) {
    rdzv_.check_store();
    const auto lost = rdzv_.lost_members(round);
    // --ft: a lost node's ranks dropped out, and the others finished without them.
    const int done = rdzv_.successes(round.number) + (ft_ ? static_cast<int>(lost.size()) : 0);
    if (done >= static_cast<int>(round.members.size())) {
      if (ft_) note_lost(round, lost);
      *all_succeeded = true;
      return std::nullopt;
    }
    if (auto f = rdzv_.failure(round.number)) return f;
    if (!lost.empty() && !ft_) {
      return rdzv_.report_failure(
          lost_node_failure(round.number, lost.front(), options_.rdzv_node_timeout_s));
    }
    if (interrupted()) return std::nullopt;
    std::this_thread::sleep_for(kPoll);
  }
}

int Agent::run() {
  grace_ = std::chrono::milliseconds(std::llround(options_.grace_period_s * 1000.0));
  log_line(std::string(rdzv_.is_host() ? "hosting" : "connected to") + " the rendezvous at " +
           rdzv_.endpoint() + " (rdzv id " + options_.rdzv_id + ", nodes " +
           std::to_string(options_.min_nodes) + ":" + std::to_string(options_.max_nodes) + ")");
  int min_round = 0;
  for (;;) {
    Round round;
    std::string status;
    switch (rdzv_.join(min_round, [this] { return interrupted(); }, &round, &status)) {
      case Rendezvous::JoinOutcome::kJobSucceeded:
        log_line("the job finished while this node waited to be admitted; nothing left to do");
        return 0;
      case Rendezvous::JoinOutcome::kJobFailed:
        log_line("the job failed while this node waited to be admitted (the other nodes' "
                 "summaries name the root cause)");
        return kExitFailed;
      case Rendezvous::JoinOutcome::kInterrupted:
        log_line("received " + signal_name(stop_signal_) + " while waiting for the rendezvous");
        return finish(128 + stop_signal_);
      case Rendezvous::JoinOutcome::kTimedOut:
        log_line("error: the rendezvous timed out: " + status +
                 "; start the missing nodes, or lower MIN in --nnodes MIN:MAX");
        rdzv_.set_job_state(false);
        if (min_round > 0) print_job_root_cause(rdzv_, min_round - 1, options_.max_restarts);
        return finish(kExitFailed);
      case Rendezvous::JoinOutcome::kJoined:
        break;
    }
    const int r = round.number;
    for (const auto& m : round.members) {
      if (m.nproc != options_.nproc_per_node) {
        log_line("error: node " + std::to_string(m.node_rank) + " (" + m.addr + ") runs " +
                 std::to_string(m.nproc) + " workers and this node " +
                 std::to_string(options_.nproc_per_node) +
                 "; every node must use the same --nproc-per-node");
        rdzv_.set_job_state(false);
        return finish(kExitFailed);
      }
    }
    const int nnodes = static_cast<int>(round.members.size());
    log_line("round " + std::to_string(r) + ": node rank " + std::to_string(round.node_rank) +
             " of " + std::to_string(nnodes) + " nodes, world size " +
             std::to_string(nnodes * options_.nproc_per_node) + ", workers' store at " +
             round.master_addr + ":" + std::to_string(round.master_port));
    group_.set_layout(round.node_rank, nnodes, round.master_addr, round.master_port);
    if (options_.ft) {
      ft_.reset();  // the last round's store
      ft_ = std::make_unique<FtReporter>(options_, round.master_addr, round.master_port,
                                         round.serves_workers_store);
    }
    std::optional<RoundFailure> remote;
    group_.set_monitor_hook(
        [&] {
          rdzv_.check_store();  // throws when this node is cut off from the rendezvous
          if ((remote = rdzv_.failure(r))) return true;
          const auto lost = rdzv_.lost_members(round);
          if (lost.empty()) return false;
          if (ft_) {
            note_lost(round, lost);
            return false;
          }
          remote = rdzv_.report_failure(
              lost_node_failure(r, lost.front(), options_.rdzv_node_timeout_s));
          return true;
        },
        kHookInterval);
    group_.start(r);
    MonitorResult result;
    try {
      result = group_.monitor();
      // --ft: a worker that fails is reported to the others, which go on (ft_reporter.h).
      if (ft_) result = ft_->monitor(group_, r, result, tally_);
    } catch (const RendezvousError& e) {  // cut off from the rendezvous host (or its store)
      log_line(std::string("error: ") + e.what());
      log_line(std::string("stopping this node's workers (SIGTERM, SIGKILL after ") +
               seconds_text(options_.grace_period_s) + ")" +
               (options_.ft ? "; --ft: cut off from the agent that hosts the rendezvous, they have "
                              "no quorum, and the nodes that still reach it go on without them"
                            : ""));
      group_.stop(SIGTERM, grace_);
      return kExitFailed;
    }
    RoundFailure counted;
    switch (result.outcome) {
      case MonitorResult::Outcome::kSucceeded: {
        group_.stop(SIGTERM, grace_);
        rdzv_.report_success(r);
        bool all = false;
        auto f = wait_for_round(round, &all);
        if (all) {
          rdzv_.set_job_state(true);
          log_line("all workers of all " + std::to_string(nnodes) + " nodes exited 0" +
                   (r > 0 ? " after " + std::to_string(r) + " restart" + (r == 1 ? "" : "s")
                          : std::string()));
          return finish(0);
        }
        if (!f) return finish(128 + stop_signal_);  // interrupted while waiting
        counted = *f;
        break;
      }
      case MonitorResult::Outcome::kWorkerFailed:
        counted = handle_local_failure(round, result);
        break;
      case MonitorResult::Outcome::kExternal:
        counted = *remote;
        log_line("round " + std::to_string(r) + " failed on another node: " + describe(counted) +
                 "; stopping this node's workers (SIGTERM, SIGKILL after " +
                 seconds_text(options_.grace_period_s) + ")");
        group_.stop(SIGTERM, grace_);
        break;
      case MonitorResult::Outcome::kInterrupted:
        return finish(stop_on_signal(group_, result.signal, options_.grace_period_s));
    }
    if (const int sig = group_.received_stop_signal(); sig != 0) {
      log_line("received " + signal_name(sig) + " while handling the failure; not restarting");
      return finish(128 + sig);
    }
    if (!counted.final_reason.empty()) {
      log_line("round " + std::to_string(r) + " failed: " + describe(counted) + " (" +
               counted.final_reason + "); a restart cannot fix it; not restarting");
      rdzv_.set_job_state(false);
      print_job_root_cause(rdzv_, r, options_.max_restarts);
      return finish(kExitFinal);
    }
    if (r >= options_.max_restarts) {
      rdzv_.set_job_state(false);
      print_job_root_cause(rdzv_, r, options_.max_restarts);
      return finish(kExitFailed);
    }
    log_line("round " + std::to_string(r) + " failed: " + describe(counted) +
             "; restarting the workers of every node (restart " + std::to_string(r + 1) +
             " of at most " + std::to_string(options_.max_restarts) + ")");
    rdzv_.open_round(r + 1);
    min_round = r + 1;
  }
}

}  // namespace

int run_elastic_agent(LauncherOptions options, std::vector<std::string> env) {
  std::string token;
  try {
    token = load_job_token(env, options.rdzv_token_file);
  } catch (const ConfigError& e) {
    log_line(std::string("error: ") + e.what());
    return kExitUsage;
  }
  if (token.empty()) {
    log_line("error: a multi-node run needs a job token shared by all its nodes: set "
             "TANDEM_JOB_TOKEN (at least 8 characters) or pass --rdzv-token-file FILE");
    return kExitUsage;
  }
  // The workers need no token; keep the secret out of their environment.
  env.erase(std::remove_if(env.begin(), env.end(),
                           [](const std::string& e) {
                             return e.rfind("TANDEM_JOB_TOKEN=", 0) == 0;
                           }),
            env.end());
  try {
    Agent agent(std::move(options), std::move(env), std::move(token));
    return agent.run();
  } catch (const Error& e) {
    log_line(std::string("error: ") + e.what());
    return kExitFailed;
  }
}

}  // namespace tandem::launcher
