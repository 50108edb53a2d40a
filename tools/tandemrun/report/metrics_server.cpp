// tandemrun --metrics-port (tools/tandemrun/report/metrics_server.h).
#include "tools/tandemrun/report/metrics_server.h"

#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include <httplib.h>

#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <sstream>

namespace tandem::launcher {

namespace {

struct Family {
  const char* name;   // Prometheus name
  const char* type;   // counter | gauge
  const char* help;
  const char* key;    // the worker file's key ("" : derived)
};

// Per-rank series, in exposition order.
const Family kRankFamilies[] = {
    {"tandem_steps_total", "counter", "Training steps completed.", "steps"},
    {"tandem_samples_total", "counter", "Samples this rank processed.", "samples"},
    {"tandem_samples_per_second", "gauge", "Samples per second of this rank, over the last half second or more.",
     "samples_per_second"},
    {"tandem_loss", "gauge", "Loss of the last step.", "loss"},
    {"tandem_step_seconds", "gauge", "Duration of the last step.", "step_seconds"},
    {"tandem_comm_seconds", "gauge",
     "The last step's gradient reduction: in flight during backward plus waited after it.", "comm_seconds"},
    {"tandem_exposed_comm_seconds", "gauge",
     "Of tandem_comm_seconds, the part waited after backward (not hidden by compute).", "exposed_comm_seconds"},
};

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

// The worker's metrics file; "" while it does not exist yet (or cannot be read): that rank
// contributes no series to this scrape.
std::string read_metrics_file(const std::string& path) {
  try {
    return posix_file_system()->read_file(path);
  } catch (const Error&) {
    return "";
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

RankMetrics parse_rank_metrics(const std::string& text) {
  RankMetrics m;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto space = line.rfind(' ');
    if (space == std::string::npos || space == 0) continue;
    try {
      m[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
      // A torn or foreign line: skipped (the file is rewritten twice a second).
    }
  }
  return m;
}

std::string render_prometheus(const std::map<int, RankMetrics>& ranks, int restarts, int workers, double now) {
  std::string out;
  const auto header = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  const auto label = [](int rank, const std::string& extra = "") {
    return "{rank=\"" + std::to_string(rank) + "\"" + (extra.empty() ? "" : "," + extra) + "}";
  };
  for (const Family& f : kRankFamilies) {
    header(f.name, f.type, f.help);
    for (const auto& [rank, m] : ranks) {
      const auto it = m.find(f.key);
      if (it != m.end()) out += f.name + label(rank) + " " + number(it->second) + "\n";
    }
  }
  header("tandem_wire_bytes_total", "counter", "Bytes this rank sent reducing gradients, per codec.");
  for (const auto& [rank, m] : ranks) {
    for (const auto& [key, v] : m) {
      if (key.rfind("wire_bytes{", 0) != 0) continue;
      out += "tandem_wire_bytes_total" + label(rank, key.substr(11, key.size() - 12)) + " " + number(v) + "\n";
    }
  }
  header("tandem_allocator_bytes", "gauge",
         "tandem's CPU allocator: bytes allocated, reserved from the system, and the allocated peak.");
  for (const auto& [rank, m] : ranks) {
    for (const char* kind : {"allocated", "reserved", "peak"}) {
      const auto it = m.find(std::string("allocator_") + kind + "_bytes");
      if (it != m.end()) out += "tandem_allocator_bytes" + label(rank, std::string("kind=\"") + kind + "\"") + " " + number(it->second) + "\n";
    }
  }
  header("tandem_checkpoint_age_seconds", "gauge", "Seconds since this rank's last committed checkpoint.");
  for (const auto& [rank, m] : ranks) {
    const auto it = m.find("checkpoint_time");
    if (it != m.end()) out += "tandem_checkpoint_age_seconds" + label(rank) + " " + number(now - it->second) + "\n";
  }
  double node_rate = 0;
  for (const auto& [rank, m] : ranks) {
    const auto it = m.find("samples_per_second");
    if (it != m.end()) node_rate += it->second;
  }
  header("tandem_node_samples_per_second", "gauge", "Samples per second of this node's ranks together.");
  out += "tandem_node_samples_per_second " + number(node_rate) + "\n";
  header("tandem_workers", "gauge", "Local workers of the current attempt, and how many publish metrics.");
  out += "tandem_workers{state=\"running\"} " + std::to_string(workers) + "\n";
  out += "tandem_workers{state=\"publishing\"} " + std::to_string(ranks.size()) + "\n";
  header("tandem_restarts_total", "counter", "Times tandemrun restarted the worker group.");
  out += "tandem_restarts_total " + std::to_string(restarts) + "\n";
  return out;
}

MetricsServer::MetricsServer(const std::string& host, int port) : server_(std::make_unique<httplib::Server>()) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(scrape(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("tandemrun metrics: /metrics\n", "text/plain");
  });
  if (!server_->bind_to_port(host.c_str(), port)) {
    throw Error("tandemrun: --metrics-port: cannot listen on " + host + ":" + std::to_string(port) +
                " (in use, or not an address of this host); choose another --metrics-port or --metrics-host");
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "tandem-metrics");
    server_->listen_after_bind();
  });
}

MetricsServer::~MetricsServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::set_sources(std::vector<Source> sources) {
  std::lock_guard<std::mutex> lock(mutex_);
  sources_ = std::move(sources);
}

void MetricsServer::set_restarts(int restarts) {
  std::lock_guard<std::mutex> lock(mutex_);
  restarts_ = restarts;
}

std::string MetricsServer::scrape() const {
  std::vector<Source> sources;
  int restarts = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sources = sources_;
    restarts = restarts_;
  }
  std::map<int, RankMetrics> ranks;
  for (const auto& s : sources) {
    RankMetrics m = parse_rank_metrics(read_metrics_file(s.file));
    if (!m.empty()) ranks[s.rank] = std::move(m);
  }
  return render_prometheus(ranks, restarts, static_cast<int>(sources.size()), now_s());
}

}  // namespace tandem::launcher
