#include "tools/tandemrun/ft/ft_reporter.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

#include <tandem/base/errors.h>

#include "base/launch_contract.h"
#include "tools/tandemrun/launch/fd_io.h"
#include "tools/tandemrun/elastic/rendezvous_store.h"
#include "tools/tandemrun/report/run_summary.h"
#include "tools/tandemrun/launch/worker_env.h"

namespace tandem::launcher {

FtReporter::FtReporter(const LauncherOptions& options, const std::string& host, int port, bool serve)
    : options_(options), endpoint_(host + ":" + std::to_string(port)) {
  StoreAddress address;
  address.host = host;
  address.port = port;
  address.server = serve;
  // A client waits this long for the serving agent to come up, and for each request.
  address.timeout = std::chrono::seconds(30);
  try {
    store_ = connect_store(address);
  } catch (const Error&) {
    throw;  // the store module is missing: its message says what to do
  } catch (const std::exception& e) {
    if (serve) {
      throw Error("--ft: tandemrun cannot serve the workers' rendezvous store at " + host + ":" +
                  std::to_string(port) + " (" + e.what() +
                  "); pick a free --master-port on this host, or use --standalone");
    }
    throw Error("--ft: this node cannot reach the workers' store at " + host + ":" +
                std::to_string(port) + ", which the agent hosting the rendezvous serves (" +
                e.what() + "); check that the nodes reach each other there");
  }
  // A report that hangs (the serving node is gone) must not hold this node for 30 s.
  if (!serve) store_->set_timeout(std::chrono::milliseconds(std::max<long long>(
                  1000, static_cast<long long>(options.rdzv_node_timeout_s * 1000.0))));
}

int FtReporter::report_failures(WorkerGroup& group, int restart_count) {
  int reported = 0;
  const std::string keys = ft_keys(options_, restart_count);
  for (const Worker& w : group.workers()) {
    if (!w.failed_on_its_own() || reported_.count({w.local_rank, w.incarnation}) > 0) continue;
    if (w.hung && !w.exit) group.kill_worker(w.local_rank);
    const std::string what = describe_failure(w, options_.heartbeat_timeout_s);
    store_->set(launch::ft_dead_key(keys, w.rank, w.incarnation), what);
    store_->add(launch::ft_dead_count_key(keys), 1);
    reported_.insert({w.local_rank, w.incarnation});
    ++reported;
    log_line("rank " + std::to_string(w.rank) + " " + what +
             "; the other workers drop the step and go on without it (" +
             (options_.ft_replace ? "--ft-replace" : "--ft") + ")");
  }
  return reported;
}

void FtReporter::cut_off(const std::exception& e) const {
  throw RendezvousError("--ft: the workers' store at " + endpoint_ + " stopped answering (" +
                        e.what() + "): this node is cut off from the agent that serves it, so its "
                        "workers cannot take part in a quorum; they stop");
}

void FtReporter::report_lost_ranks(int first, int count, int restart_count, const std::string& what) {
  const std::string keys = ft_keys(options_, restart_count);
  try {
    for (int rank = first; rank < first + count; ++rank)
      store_->set(launch::ft_dead_any_key(keys, rank), what);
    store_->add(launch::ft_dead_count_key(keys), 1);
  } catch (const std::exception& e) {
    cut_off(e);
  }
}

bool FtReporter::group_failed(int restart_count) {
  const auto why = store_->get(launch::ft_group_failed_key(ft_keys(options_, restart_count)));
  if (why) log_line("the workers cannot go on without a restart: " + *why);
  return why.has_value();
}

MonitorResult FtReporter::monitor(WorkerGroup& group, int restart_count, MonitorResult result,
                                  FtTally& tally) {
  // (A hung worker that was SIGKILLed fails again when it exits: reported already, no news.)
  while (result.outcome == MonitorResult::Outcome::kWorkerFailed) {
    try {
      tally.tolerated += report_failures(group, restart_count);
      tally.group_failed = group_failed(restart_count);
    } catch (const std::exception& e) {
      cut_off(e);
    }
    if (tally.group_failed) break;
    const auto& w = group.workers();
    if (std::none_of(w.begin(), w.end(), [](const Worker& x) { return !x.exit && !x.hung; })) {
      // The others finished training (a replacement found nothing left to join), or nobody is
      // left to go on: the attempt fails as without --ft.
      if (std::any_of(w.begin(), w.end(), [](const Worker& x) { return x.exit && x.exit->success(); }))
        result.outcome = MonitorResult::Outcome::kSucceeded;
      break;
    }
    for (std::size_t i = 0; options_.ft_replace && i < w.size(); ++i) {
      if (!w[i].failed_on_its_own()) continue;
      if (tally.replaced >= options_.max_restarts) {
        log_line("rank " + std::to_string(w[i].rank) + " is not replaced: all " +
                 std::to_string(options_.max_restarts) + " replacements/restarts (--max-restarts) "
                 "are used; the others go on without it");
        continue;
      }
      ++tally.replaced;
      const bool standby = group.replace_worker(static_cast<int>(i), restart_count,
                                                /*restock=*/tally.replaced < options_.max_restarts);
      log_line("rank " + std::to_string(w[i].rank) + ": replacement " +
               std::to_string(w[i].incarnation) + " started" + (standby ? " from its standby" : "") +
               "; it joins the others at their next step and heals from a live peer (--ft-replace; " +
               std::to_string(tally.replaced) + " of at most " +
               std::to_string(options_.max_restarts) + " --max-restarts used)");
    }
    group.clear_failures();
    result = group.monitor();
  }
  return result;
}

}  // namespace tandem::launcher
