// bench_trace: what one timeline event costs the thread that records it.
//
//   build/bin/bench_trace [--events N] [--rounds R] [--json bench/results/trace_overhead.json]
//
// For a scoped Span (the common case), disabled and enabled, single thread and 2 threads at once:
// nanoseconds per span (wall time / spans per thread), median over rounds. A
// DistributedDataParallel step records 3 + 4 x buckets events (forward, backward, reduce wait; per
// bucket: async begin/end, the collective, codec encode), so per-step overhead ~ events x ns
// (docs/timeline.md has the measured figures).
#include <tandem/base/trace.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double spans_ns(int64_t n, int threads) {
  auto body = [n] {
    for (int64_t i = 0; i < n; ++i) {
      tandem::trace::Span span("bench", tandem::trace::kCompute);
      span.arg("i", i);
    }
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t events = 200000;
  int rounds = 7;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--events") == 0) events = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
  }
  char tmpl[] = "/tmp/bench-trace-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  struct Row {
    const char* what;
    bool enabled;
    int threads;
    double ns = 0;
  };
  std::vector<Row> rows = {{"span, disabled", false, 1},
                           {"span, enabled", true, 1},
                           {"span, disabled, 2 threads", false, 2},
                           {"span, enabled, 2 threads", true, 2}};
  for (auto& row : rows) {
    std::vector<double> samples;
    for (int r = 0; r < rounds; ++r) {
      tandem::TraceOptions options;
      options.enabled = row.enabled;
      options.dir = dir;
      options.max_events = events * row.threads + 1;
      tandem::trace::start(options, 0);
      samples.push_back(spans_ns(events, row.threads));
      tandem::trace::stop();  // writing the file is not part of the hot path
    }
    row.ns = median(samples);
  }
  std::printf("%-28s %12s\n", "recorder", "ns / span");
  for (const auto& row : rows) std::printf("%-28s %12.1f\n", row.what, row.ns);
  std::printf("(%lld spans per round, median of %d rounds)\n", static_cast<long long>(events), rounds);
  if (!json.empty()) {
    if (std::FILE* f = std::fopen(json.c_str(), "w")) {
      std::fprintf(f, "{\"bench\":\"trace\",\"events_per_round\":%lld,\"rounds\":%d,\"ns_per_span\":{",
                   static_cast<long long>(events), rounds);
      for (size_t i = 0; i < rows.size(); ++i) {
        std::fprintf(f, "%s\"%s\":%.1f", i ? "," : "", rows[i].what, rows[i].ns);
      }
      std::fprintf(f, "}}\n");
      std::fclose(f);
    }
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return 0;
}
