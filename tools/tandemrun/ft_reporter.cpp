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
    if (!w.failed_on_its_own() || reported_.count(w.local_rank) > 0) continue;
    if (w.hung && !w.exit) group.kill_worker(w.local_rank);
    const std::string what = describe_failure(w, options_.heartbeat_timeout_s);
    store_->set(prefix + std::to_string(w.rank), what);
    store_->add(prefix + "count", 1);
    reported_.insert(w.local_rank);
    ++reported;
    log_line("rank " + std::to_string(w.rank) + " " + what +
             "; the other workers drop the step and go on without it (--ft)");
  }
  return reported;
}

}  // namespace tandem::launcher
