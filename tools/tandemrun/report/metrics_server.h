// tandemrun --metrics-port: the local ranks' live metrics over HTTP in Prometheus's text exposition
// format (docs/metrics.md). Each worker rewrites a small file (TANDEM_METRICS_FILE, "name value"
// lines, see runtime/live_metrics.h) at most twice a second; every scrape of /metrics reads them
// and renders per-rank series plus node totals and tandemrun's own restart count.
//
// Ownership: owns its HTTP server (cpp-httplib) and the thread that runs it, stopped and joined by
// the destructor. Thread-safety: set_sources() and set_restarts() may be called from the launcher's
// thread while the server thread scrapes. Errors: the constructor throws tandem::Error naming the
// address when it cannot bind.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace tandem::launcher {

// One rank's metrics file: "name value" lines; name may carry labels (wire_bytes{codec="fp16"}).
using RankMetrics = std::map<std::string, double>;
RankMetrics parse_rank_metrics(const std::string& text);

// The exposition for `ranks` (rank -> its metrics), `restarts` and `workers` local workers at
// wall-clock time `now` (seconds since the epoch). Pure.
std::string render_prometheus(const std::map<int, RankMetrics>& ranks, int restarts, int workers, double now);

class MetricsServer {
 public:
  struct Source {
    int rank = 0;
    std::string file;
  };
  MetricsServer(const std::string& host, int port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void set_sources(std::vector<Source> sources);
  void set_restarts(int restarts);
  // What a scrape returns now.
  std::string scrape() const;

 private:
  mutable std::mutex mutex_;
  std::vector<Source> sources_;
  int restarts_ = 0;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace tandem::launcher
