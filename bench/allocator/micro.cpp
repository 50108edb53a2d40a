// (a) alloc+free pairs, 64 B .. 64 MiB, through one allocator per process:
//   --allocator=malloc        the C library's malloc/free (glibc; jemalloc or mimalloc when the
//                             script LD_PRELOADs them)
//   --allocator=tandem        CachingPool(HostBackend), the fast path
//   --allocator=tandem_stack  StatisticsResource(CachingPool(HostBackend)), what libtorch gets
// plus the cost of stack capture at several depths (--allocator=stacks).
// --out FILE writes {"<size>": ns_per_pair, ...} (or {"<depth>": ns}) for scripts/bench-allocator.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/stack_trace.h>

namespace {

const std::size_t kSizes[] = {64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10,
                              1 << 20, 4 << 20, 16 << 20, 64 << 20};

void bm_malloc(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    benchmark::ClobberMemory();
    std::free(p);
  }
}

tandem::memory::MemoryResource* g_resource = nullptr;

void bm_resource(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  tandem::memory::MemoryResource& r = *g_resource;
  for (auto _ : state) {
    void* p = r.allocate(n);
    benchmark::DoNotOptimize(p);
    benchmark::ClobberMemory();
    r.deallocate(p, n);
  }
}

__attribute__((noinline)) std::size_t recurse_then_capture(int depth, void** frames, std::size_t max) {
  if (depth > 0) {
    const std::size_t n = recurse_then_capture(depth - 1, frames, max);
    benchmark::DoNotOptimize(n);
    return n;
  }
  return tandem::memory::capture_stack(frames, max, 0);
}

// Capture `range(0)` frames from a stack at least that deep.
void bm_capture(benchmark::State& state) {
  const auto depth = static_cast<std::size_t>(state.range(0));
  void* frames[256];
  for (auto _ : state) {
    benchmark::DoNotOptimize(recurse_then_capture(static_cast<int>(depth), frames, depth));
  }
}

class Collect : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      std::string name = r.benchmark_name();
      results[name.substr(name.find('/') + 1)] = r.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> results;
};

}  // namespace

int main(int argc, char** argv) {
  std::string allocator = "tandem", out;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--allocator=", 0) == 0) allocator = a.substr(12);
    else if (a.rfind("--out=", 0) == 0) out = a.substr(6);
    else rest.push_back(argv[i]);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());

  tandem::memory::HostMemoryStackOptions options;
  options.statistics = allocator == "tandem_stack";
  tandem::memory::HostMemoryStack stack(options);
  if (allocator == "malloc") {
    for (auto n : kSizes) benchmark::RegisterBenchmark("pair", bm_malloc)->Arg(static_cast<int64_t>(n));
  } else if (allocator == "tandem" || allocator == "tandem_stack") {
    g_resource = &stack.top();
    for (auto n : kSizes) benchmark::RegisterBenchmark("pair", bm_resource)->Arg(static_cast<int64_t>(n));
  } else if (allocator == "stacks") {
    for (int d : {8, 16, 32, 48, 64})
      benchmark::RegisterBenchmark("capture", bm_capture)->Arg(d);
  } else {
    std::fprintf(stderr, "bench_allocator_micro: unknown --allocator=%s (malloc, tandem, tandem_stack, stacks)\n",
                 allocator.c_str());
    return 2;
  }
  Collect reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  if (!out.empty()) {
    std::ofstream f(out);
    f << "{";
    bool first = true;
    for (const auto& [k, v] : reporter.results) {
      f << (first ? "" : ", ") << "\"" << k << "\": " << v;
      first = false;
    }
    f << "}\n";
  }
  return 0;
}
