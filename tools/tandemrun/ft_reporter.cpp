#include "tools/tandemrun/ft_reporter.h"

#include <chrono>
#include <exception>
#include <string>

#include <tandem/base/errors.h>

#include "tools/tandemrun/fd_io.h"
#include "tools/tandemrun/run_summary.h"
#include "tools/tandemrun/worker_env.h"

namespace tandem::launcher {

FtReporter::FtReporter(const LauncherOptions& options) : options_(options) {
  StoreAddress address;
  address.host = options.master_addr;
  address.port = options.master_port;
  address.server = true;
  address.timeout = std::chrono::seconds(30);
  try {
    store_ = connect_store(address);
  } catch (const Error&) {
    throw;  // the store module is missing: its message says what to do
  } catch (const std::exception& e) {
    throw Error("--ft: tandemrun cannot serve the workers' rendezvous store at " +
                options.master_addr + ":" + std::to_string(options.master_port) + " (" + e.what() +
                "); pick a free --master-port on this host, or use --standalone");
  }
}

int FtReporter::report_failures(WorkerGroup& group, int restart_count) {
  int reported = 0;
  const std::string prefix = ft_keys(options_, restart_count) + "/dead/";
  for (const Worker& w : group.workers()) {
    if (!w.failed_on_its_own() || reported_.count({w.local_rank, w.incarnation}) > 0) continue;
    if (w.hung && !w.exit) group.kill_worker(w.local_rank);
    const std::string what = describe_failure(w, options_.heartbeat_timeout_s);
    store_->set(prefix + std::to_string(w.rank) + "." + std::to_string(w.incarnation), what);
    store_->add(prefix + "count", 1);
    reported_.insert({w.local_rank, w.incarnation});
    ++reported;
    log_line("rank " + std::to_string(w.rank) + " " + what +
             "; the other workers drop the step and go on without it (" +
             (options_.ft_replace ? "--ft-replace" : "--ft") + ")");
  }
  return reported;
}

bool FtReporter::group_failed(int restart_count) {
  const auto why = store_->get(ft_keys(options_, restart_count) + "/group_failed");
  if (why) log_line("the workers cannot go on without a restart: " + *why);
  return why.has_value();
}

}  // namespace tandem::launcher
