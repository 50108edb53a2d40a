// Allreduce bus bandwidth of tandem's Gloo communicator. Its PyTorch peer, torch.distributed's
// gloo backend, is bench/collectives/pytorch_allreduce.py (the same protocol, in Python: the wheel
// ships no Gloo headers, so c10d::ProcessGroupGloo cannot be built against here);
// scripts/bench collectives runs the two alternately in rounds and merges their JSON.
//
// One worker program, started on N ranks by the launcher (scripts/bench collectives does this):
//   OMP_NUM_THREADS=1 tandemrun --standalone --nproc-per-node 2
//       build/bin/bench_collectives --out FILE [--quick] [--sizes B ...] [--repetitions R]
//
// Every rank connects
//   tandem      tandem::init() with its defaults (it hosts/joins the c10d TCPStore): the world
//               communicator a training program gets; when GlooOptions has `shared_memory` and
//               all ranks share this host, its allreduce goes through shared memory;
//   tandem_tcp  (only when GlooOptions has `shared_memory`) connect_gloo() with
//               shared_memory = false: libgloo's bcube/ring over loopback TCP, the like-for-like
//               comparison with torch.distributed's gloo backend.
// For each size (float32, 4 KiB .. 256 MiB; 16 MiB in --quick) every implementation is checked
// once for correctness on the same tensor, warmed up, then timed in interleaved repetitions: each
// repetition runs the implementations in the next permutation of their order (so drift on a shared
// machine hits all alike and none always follows the same neighbour), each as a barrier followed
// by `iterations` allreduce+wait back to back. `iterations` is the same for all implementations,
// sized from the warm-up so that the slowest takes about 0.25 s (0.04 s in --quick). A
// repetition's time is the slowest rank's; the figure is the median over repetitions.
// busbw = bytes / time * 2(n-1)/n in GB/s (1e9 bytes/s).
//
// Rank 0 also measures one-core memcpy bandwidth (256 MiB, pages faulted in first, bytes copied /
// time) while the other ranks wait at a barrier, prints a table and writes the JSON file.
#include <tandem/tandem.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;

struct Settings {
  std::vector<int64_t> sizes;
  int repetitions = 0;
  // Each repetition of each implementation runs the same number of back-to-back ops, chosen per
  // size so the slowest implementation takes about `target_rep_s` (from the warm-up's timing),
  // clamped to [min_iters, max_iters].
  double target_rep_s = 0;
  int min_iters = 0;
  int max_iters = 0;
  int memcpy_reps = 0;
};

Settings settings_for(bool quick) {
  Settings s;
  const int64_t largest = quick ? 16 * kMiB : 256 * kMiB;
  for (int64_t b = 4 * kKiB; b <= largest; b *= 4) s.sizes.push_back(b);
  if (quick) {
    s.repetitions = 3;
    s.target_rep_s = 0.04;
    s.min_iters = 2;
    s.max_iters = 200;
    s.memcpy_reps = 3;
  } else {
    s.repetitions = 6;
    s.target_rep_s = 0.25;
    s.min_iters = 3;
    s.max_iters = 2000;
    s.memcpy_reps = 5;
  }
  return s;
}

// Warm-up ops per implementation: enough to settle buffers and connections, at least 3.
int warmup_for(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>(4 * kMiB / bytes, 3, 50));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string format_size(int64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= kKiB && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  return std::to_string(bytes) + " B";
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        return value;
      }
    }
  }
  return "unknown CPU";
}

// Mappings of POSIX shared memory in this process (tandem unlinks its segment once mapped, so the
// entry reads "/dev/shm/NAME (deleted)"). Used only to label which transport tandem picked.
int count_shm_mappings() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find("/dev/shm/") != std::string::npos ? 1 : 0;
  return n;
}

// GlooOptions::shared_memory exists only in trees with tandem's shared-memory allreduce.
template <class T, class = void>
struct HasSharedMemory : std::false_type {};
template <class T>
struct HasSharedMemory<T, std::void_t<decltype(std::declval<T&>().shared_memory)>>
    : std::true_type {};

// Sets `shared_memory = false`; false when the option does not exist (TCP is then the only path).
template <class Options>
bool disable_shared_memory(Options& options) {
  if constexpr (HasSharedMemory<Options>::value) {
    options.shared_memory = false;
    return true;
  } else {
    return false;
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

template <class T, class Format>
std::string json_array(const std::vector<T>& v, Format&& format) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + format(v[i]);
  return out + "]";
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// One-core memcpy of a 256 MiB buffer into another (both faulted in first); bytes copied / time.
double measure_memcpy_gbps(int reps) {
  const size_t bytes = 256 * kMiB;
  std::unique_ptr<char[]> src(new char[bytes]);
  std::unique_ptr<char[]> dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);
  std::memcpy(dst.get(), src.get(), bytes);  // warm-up
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    src[static_cast<size_t>(r) * 4096] = static_cast<char>(r);
    const auto t0 = Clock::now();
    std::memcpy(dst.get(), src.get(), bytes);
    const double s = seconds_since(t0);
    if (dst[static_cast<size_t>(r) * 4096] != static_cast<char>(r)) {
      throw std::runtime_error("memcpy check failed");
    }
    gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  return median(gbps);
}

// Rank r holds (i % 251) * (r + 1); the sum over n ranks is (i % 251) * n (n + 1) / 2. Every value
// is an integer below 2^24, so float32 sums are exact whatever the reduction order.
void fill_pattern(const at::Tensor& t, int rank) {
  float* p = t.data_ptr<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((i % 251) * (rank + 1));
}

void check_pattern(const at::Tensor& t, int world, const std::string& impl, int64_t bytes) {
  const float* p = t.data_ptr<float>();
  const int64_t n = t.numel();
  const int64_t factor = static_cast<int64_t>(world) * (world + 1) / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float want = static_cast<float>((i % 251) * factor);
    if (p[i] != want) {
      throw std::runtime_error("bench_collectives: " + impl + " allreduce of " +
                               format_size(bytes) + " is wrong: element " + std::to_string(i) +
                               " is " + std::to_string(p[i]) + ", expected " +
                               std::to_string(want));
    }
  }
}

// One allreduce implementation under test.
struct Impl {
  std::string key;        // JSON key prefix and table column
  std::string transport;  // what carries its allreduce, for the JSON
  // Allreduce (sum) of `t` in place, blocking until done; returns the bytes the op was given.
  std::function<int64_t(const at::Tensor&)> allreduce;
};

struct SizeResult {
  int64_t bytes = 0;
  int iterations = 0;
  int warmup = 0;
  std::vector<std::vector<double>> ms_per_rep;  // [impl][rep]: slowest rank, mean per op
  std::vector<double> median_ms;                // [impl]
};

double busbw_gbps(int64_t bytes, double ms, int world) {
  const double algbw = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  return algbw * 2.0 * (world - 1) / world;
}

std::string worker_command(int argc, char** argv, int world) {
  std::string cmd = "tandemrun --standalone --nproc-per-node " + std::to_string(world);
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--command" || a == "--revision") {  // recorded separately
      ++i;
      continue;
    }
    cmd += " " + a;
  }
  return cmd;
}

struct RunInfo {
  std::string command;
  std::string worker_command;
  std::string revision;
  bool quick = false;
  int world = 0;
  double memcpy_gbps = 0;
  std::string load_start;
  std::string load_end;
  double total_s = 0;
};

void write_json(const std::string& path, const std::vector<Impl>& impls,
                const std::vector<SizeResult>& results, const Settings& settings,
                const RunInfo& info) {
  auto ints = [](int64_t v) { return std::to_string(v); };
  auto ms = [](double v) { return fixed(v, 4); };
  auto gbps = [](double v) { return fixed(v, 3); };
  auto raw = [](const std::string& s) { return s; };
  std::vector<int64_t> sizes, iterations, warmups;
  for (const auto& r : results) {
    sizes.push_back(r.bytes);
    iterations.push_back(r.iterations);
    warmups.push_back(r.warmup);
  }
  std::ostringstream o;
  o << "{\n"
    << "  \"benchmark\": \"allreduce (sum) bus bandwidth, float32: tandem's Gloo communicator "
       "(bench_collectives; its PyTorch peer is bench/collectives/pytorch_allreduce.py)\",\n"
    << "  \"command\": " << json_string(info.command) << ",\n"
    << "  \"worker_command\": " << json_string(info.worker_command) << ",\n"
    << "  \"revision\": " << json_string(info.revision) << ",\n"
    << "  \"quick\": " << (info.quick ? "true" : "false") << ",\n"
    << "  \"machine\": "
    << json_string(std::to_string(std::thread::hardware_concurrency()) + " cores, " +
                   cpu_model() + ", ranks on one host (loopback TCP, /dev/shm)")
    << ",\n"
    << "  \"loadavg_start\": " << json_string(info.load_start) << ",\n"
    << "  \"loadavg_end\": " << json_string(info.load_end) << ",\n"
    << "  \"world_size\": " << info.world << ",\n"
    << "  \"threads_per_rank\": 1,\n"
    << "  \"threads_note\": \"per rank and implementation one thread runs the collective: "
       "tandem's op thread; libgloo's TCP event-loop thread comes with each TCP device; "
       "OMP_NUM_THREADS=1, at::set_num_threads(1)\",\n"
    << "  \"unit\": \"busbw in GB/s (1e9 B/s) = bytes / time * 2(n-1)/n; *_ms = median over "
       "repetitions of the slowest rank's mean time per allreduce+wait\",\n"
    << "  \"implementations\": "
    << json_array(impls, [](const Impl& i) { return json_string(i.key); }) << ",\n";
  for (const auto& impl : impls) {
    o << "  \"" << impl.key << "_transport\": " << json_string(impl.transport) << ",\n";
  }
  o << "  \"repetitions\": " << settings.repetitions << ",\n"
    << "  \"sizes_bytes\": " << json_array(sizes, ints) << ",\n"
    << "  \"iterations\": " << json_array(iterations, ints) << ",\n"
    << "  \"warmup_iterations\": " << json_array(warmups, ints) << ",\n";
  for (size_t k = 0; k < impls.size(); ++k) {
    std::vector<double> med, bw;
    for (const auto& r : results) {
      med.push_back(r.median_ms[k]);
      bw.push_back(busbw_gbps(r.bytes, r.median_ms[k], info.world));
    }
    o << "  \"" << impls[k].key << "_ms\": " << json_array(med, ms) << ",\n"
      << "  \"" << impls[k].key << "_busbw_gbps\": " << json_array(bw, gbps) << ",\n";
  }
  for (size_t k = 0; k < impls.size(); ++k) {
    std::vector<std::string> reps;
    for (const auto& r : results) reps.push_back(json_array(r.ms_per_rep[k], ms));
    o << "  \"" << impls[k].key << "_ms_per_rep\": " << json_array(reps, raw) << ",\n";
  }
  o << "  \"memcpy_gbps\": " << fixed(info.memcpy_gbps, 3) << ",\n"
    << "  \"memcpy_note\": \"one core, memcpy of 256 MiB between two faulted-in buffers, bytes "
       "copied / time (not read+write), median of "
    << settings.memcpy_reps << "; measured by rank 0 while the other ranks wait at a barrier\",\n"
    << "  \"total_s\": " << fixed(info.total_s, 1) << "\n"
    << "}\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << o.str();
    if (!f) throw std::runtime_error("bench_collectives: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("bench_collectives: cannot rename " + tmp + " to " + path);
  }
}

void print_table(const std::vector<Impl>& impls, const std::vector<SizeResult>& results,
                 const Settings& settings, const RunInfo& info) {
  std::printf("allreduce sum, float32, %d ranks on one host; busbw in GB/s, median of %d reps\n",
              info.world, settings.repetitions);
  for (const auto& impl : impls) std::printf("  %-11s %s\n", impl.key.c_str(), impl.transport.c_str());
  std::printf("%8s %6s", "size", "iters");
  for (const auto& impl : impls) std::printf(" %11s", impl.key.c_str());
  std::printf("\n");
  for (const auto& r : results) {
    std::printf("%8s %6d", format_size(r.bytes).c_str(), r.iterations);
    for (size_t k = 0; k < impls.size(); ++k) {
      std::printf(" %11.3f", busbw_gbps(r.bytes, r.median_ms[k], info.world));
    }
    std::printf("\n");
  }
  std::printf("busbw = bytes/time * 2(n-1)/n, GB/s = 1e9 B/s\n");
  std::printf("memcpy, one core, 256 MiB (bytes copied / time): %.3f GB/s\n", info.memcpy_gbps);
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{
      "Allreduce bus bandwidth of tandem's Gloo communicator (the PyTorch peer is "
      "bench/collectives/pytorch_allreduce.py)"};
  std::string out;
  bool quick = false;
  RunInfo info;
  std::vector<int64_t> only_sizes;
  int repetitions = 0;
  app.add_option("--out", out, "JSON file rank 0 writes")->required();
  app.add_flag("--quick", quick, "sizes up to 16 MiB, fewer iterations (smoke run)");
  app.add_option("--command", info.command, "command line recorded in the JSON (scripts/bench)");
  app.add_option("--revision", info.revision, "source revision recorded in the JSON");
  app.add_option("--sizes", only_sizes, "measure only these sizes in bytes (multiples of 4)");
  app.add_option("--repetitions", repetitions, "override the repetitions per size")
      ->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const auto started = Clock::now();
  info.quick = quick;
  info.load_start = read_first_line("/proc/loadavg");
  at::set_num_threads(1);
  Settings settings = settings_for(quick);
  for (const int64_t b : only_sizes) {
    if (b <= 0 || b % static_cast<int64_t>(sizeof(float)) != 0) {
      throw tandem::ConfigError("bench_collectives: --sizes " + std::to_string(b) +
                                " is not a positive multiple of 4 bytes.");
    }
  }
  if (!only_sizes.empty()) settings.sizes = only_sizes;
  if (repetitions > 0) settings.repetitions = repetitions;

  const int shm_before = count_shm_mappings();
  tandem::Distributed dist = tandem::init();
  tandem::Communicator& comm = *dist.world;
  const int rank = comm.rank();
  const int world = comm.size();
  info.world = world;
  if (world < 2) {
    throw tandem::ConfigError("bench_collectives: needs at least 2 ranks (got " +
                              std::to_string(world) +
                              "); start it with tandemrun --nproc-per-node 2.");
  }
  const bool tandem_on_shm = count_shm_mappings() > shm_before;

  // libgloo over loopback TCP, as torch.distributed's gloo: tandem with shared memory turned off
  // (when the option exists).
  tandem::GlooOptions tcp_options;
  tcp_options.timeout = comm.timeout();
  tcp_options.hostname = "127.0.0.1";
  tcp_options.store_prefix = "bench_collectives/tandem_tcp";
  std::shared_ptr<tandem::Communicator> tcp_comm;
  if (disable_shared_memory(tcp_options)) {
    tcp_comm = tandem::connect_gloo(dist.store, rank, world, tcp_options);
  }

  const std::string gloo_algos = "libgloo over loopback TCP (bcube below 256 KiB, ring above)";
  std::vector<Impl> impls;
  impls.push_back({"tandem",
                   tandem_on_shm ? "tandem::init() defaults: POSIX shared memory (all ranks on "
                                   "this host)"
                                 : "tandem::init() defaults: " + gloo_algos,
                   [&comm](const at::Tensor& t) {
                     comm.allreduce(t, tandem::ReduceOp::kSum)->wait();
                     return t.numel() * static_cast<int64_t>(t.element_size());
                   }});
  if (tcp_comm) {
    impls.push_back({"tandem_tcp", "connect_gloo() with shared_memory = false: " + gloo_algos,
                     [&tcp_comm](const at::Tensor& t) {
                       tcp_comm->allreduce(t, tandem::ReduceOp::kSum)->wait();
                       return t.numel() * static_cast<int64_t>(t.element_size());
                     }});
  }
  const int n_impls = static_cast<int>(impls.size());

  auto barrier = [&] { comm.barrier()->wait(); };

  // memcpy reference: rank 0 alone, the others idle at the barrier.
  barrier();
  if (rank == 0) info.memcpy_gbps = measure_memcpy_gbps(settings.memcpy_reps);
  barrier();

  std::vector<SizeResult> results;
  for (const int64_t bytes : settings.sizes) {
    const int64_t numel = bytes / static_cast<int64_t>(sizeof(float));
    // One tensor for every implementation: same bytes, same address.
    at::Tensor t = at::empty({numel}, at::kFloat);

    // Correctness, once per size and implementation; record the bytes each op was given.
    at::Tensor seen = at::empty({n_impls}, at::kLong);
    for (int k = 0; k < n_impls; ++k) {
      fill_pattern(t, rank);
      seen.data_ptr<int64_t>()[k] = impls[k].allreduce(t);
      check_pattern(t, world, impls[k].key, bytes);
    }
    // Every implementation on every rank must have run on the same size.
    at::Tensor all_seen = at::empty({n_impls * world}, at::kLong);
    comm.allgather(all_seen, seen)->wait();
    for (int64_t i = 0; i < n_impls * world; ++i) {
      const int64_t got = all_seen.data_ptr<int64_t>()[i];
      if (got != bytes) {
        throw std::runtime_error("bench_collectives: size mismatch at " + format_size(bytes) +
                                 ": rank " + std::to_string(i / n_impls) + " ran " +
                                 impls[i % n_impls].key + " on " + std::to_string(got) +
                                 " bytes");
      }
    }
    // Timed runs reduce zeros: values stay finite however many iterations run.
    t.zero_();

    SizeResult r;
    r.bytes = bytes;
    r.warmup = warmup_for(bytes);
    // Warm up, timing each implementation; the slowest rank's slowest implementation sets how
    // many ops a repetition runs (the same on every rank: all see the same maximum).
    at::Tensor warm_ms = at::empty({n_impls}, at::kDouble);
    for (int k = 0; k < n_impls; ++k) {
      barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < r.warmup; ++i) impls[k].allreduce(t);
      warm_ms.data_ptr<double>()[k] = seconds_since(t0) * 1e3 / r.warmup;
    }
    comm.allreduce(warm_ms, tandem::ReduceOp::kMax)->wait();
    const double slowest_ms = warm_ms.max().item<double>();
    r.iterations = static_cast<int>(std::clamp<double>(
        std::ceil(settings.target_rep_s * 1e3 / slowest_ms), settings.min_iters,
        settings.max_iters));
    const int reps = settings.repetitions;
    std::vector<double> mine(static_cast<size_t>(n_impls * reps));  // [impl * reps + rep]
    // Repetition `rep` runs the implementations in the rep-th permutation of their order (all
    // n! orders in turn), so none always runs first or always right after the same neighbour.
    std::vector<int> order(static_cast<size_t>(n_impls));
    std::iota(order.begin(), order.end(), 0);
    for (int rep = 0; rep < reps; ++rep) {
      if (rep > 0) std::next_permutation(order.begin(), order.end());
      for (const int k : order) {
        barrier();
        const auto t0 = Clock::now();
        for (int i = 0; i < r.iterations; ++i) impls[k].allreduce(t);
        mine[k * reps + rep] = seconds_since(t0) * 1e3 / r.iterations;
      }
    }
    // A repetition takes as long as its slowest rank.
    at::Tensor times = at::from_blob(mine.data(), {n_impls * reps}, at::kDouble).clone();
    comm.allreduce(times, tandem::ReduceOp::kMax)->wait();
    for (int k = 0; k < n_impls; ++k) {
      const double* p = times.data_ptr<double>() + k * reps;
      r.ms_per_rep.emplace_back(p, p + reps);
      r.median_ms.push_back(median(r.ms_per_rep.back()));
    }
    if (rank == 0) {
      std::string line = "bench_collectives: " + format_size(bytes) + " done (ms per op:";
      for (int k = 0; k < n_impls; ++k) line += " " + impls[k].key + " " + fixed(r.median_ms[k], 4);
      std::fprintf(stderr, "%s)\n", line.c_str());
    }
    results.push_back(std::move(r));
  }

  tcp_comm.reset();  // joins its op thread
  barrier();
  if (rank == 0) {
    info.worker_command = worker_command(argc, argv, world);
    if (info.command.empty()) info.command = info.worker_command;
    info.load_end = read_first_line("/proc/loadavg");
    info.total_s = seconds_since(started);
    print_table(impls, results, settings, info);
    write_json(out, impls, results, settings, info);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: error: %s\n", e.what());
    return 1;
  }
}
