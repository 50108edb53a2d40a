// (b) End to end: training steps, one thread, with libtorch's CPU allocator chosen by --allocator:
//   default           libtorch's own (posix_memalign: glibc; jemalloc or mimalloc when the
//                     script LD_PRELOADs them)
//   tandem            HostMemoryStack (Statistics(CachingPool(HostBackend))) installed
//   tandem_tracking   + TrackingResource without stacks
//   tandem_sampled    + TrackingResource, stacks sampled 1 in 64
//   tandem_stacks     + TrackingResource, stack of every allocation
// and the workload chosen by --workload:
//   w1     MLP 1024 -> 4x2048 ReLU -> 1024, MSE, SGD, fp32, batch 32 (33 allocations a step);
//   heavy  the byte-level transformer LM of examples/tiny_lm.h (dim 128, 4 heads, 2 layers,
//          context 128), cross-entropy, AdamW; every step draws its batch size (4..32) and
//          sequence length (16..128) from a seeded generator, the same sequence for every
//          allocator, so tensor sizes change from step to step (hundreds of allocations a step).
// Prints one JSON object: median/mean step time, CPU time and minor page faults per step, peak RSS
// and (with tandem) allocations and bytes per step and the peak reserved memory.
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <tandem/memory/cpu_allocator.h>

#include "examples/tiny_lm.h"

namespace {

struct Mlp : torch::nn::Module {
  Mlp() {
    layers.push_back(register_module("in", torch::nn::Linear(1024, 2048)));
    for (int i = 0; i < 3; ++i)
      layers.push_back(register_module("h" + std::to_string(i), torch::nn::Linear(2048, 2048)));
    out = register_module("out", torch::nn::Linear(2048, 1024));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l->forward(x));
    return out->forward(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear out{nullptr};
};

// One training step per call; `step` numbers the calls from 0.
using Step = std::function<void(int step)>;

Step make_w1() {
  auto model = std::make_shared<Mlp>();
  auto opt = std::make_shared<torch::optim::SGD>(model->parameters(), 0.01);
  auto x = torch::randn({32, 1024});
  auto y = torch::randn({32, 1024});
  return [=](int) {
    opt->zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    opt->step();
  };
}

// The heavy workload's shapes: (batch, sequence length) of each step, from a fixed seed.
std::vector<std::pair<int64_t, int64_t>> heavy_shapes(int n) {
  std::mt19937_64 rng(20);
  std::uniform_int_distribution<int64_t> batch(4, 32), length(16, 128);
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int i = 0; i < n; ++i) {
    const int64_t b = batch(rng);
    shapes.emplace_back(b, length(rng));
  }
  return shapes;
}

Step make_heavy(int total_steps) {
  tiny_lm::LmConfig c;
  c.context = 128;
  auto model = std::make_shared<tiny_lm::TinyLm>(c);
  auto opt = std::make_shared<torch::optim::AdamW>(
      (*model)->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  auto data = tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 16, 7));
  auto shapes = heavy_shapes(total_steps);
  return [=](int step) {
    const auto [batch, length] = shapes[static_cast<std::size_t>(step)];
    auto windows = tiny_lm::batch_windows(data, batch, length, 7, step, 0);
    opt->zero_grad();
    auto loss = tiny_lm::lm_loss((*model)(tiny_lm::lm_inputs(windows)), windows);
    loss.backward();
    opt->step();
  };
}

struct Usage {
  long minor_faults;
  double user_ms, sys_ms;  // CPU time of the process: unlike wall time, not inflated by other load
};

Usage usage() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_usec) / 1e3;
  };
  return {u.ru_minflt, ms(u.ru_utime), ms(u.ru_stime)};
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string allocator = "default", workload = "w1";
  int steps = 30, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--allocator=", 0) == 0)
      allocator = a.substr(12);
    else if (a.rfind("--workload=", 0) == 0)
      workload = a.substr(11);
    else if (a.rfind("--steps=", 0) == 0)
      steps = std::stoi(a.substr(8));
    else if (a.rfind("--warmup=", 0) == 0)
      warmup = std::stoi(a.substr(9));
    else {
      std::fprintf(stderr,
                   "usage: %s [--workload=w1|heavy] "
                   "[--allocator=default|tandem|tandem_tracking|tandem_sampled|tandem_stacks] "
                   "[--steps=N] [--warmup=N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (workload != "w1" && workload != "heavy") {
    std::fprintf(stderr, "unknown workload '%s' (w1 or heavy)\n", workload.c_str());
    return 2;
  }
  at::set_num_threads(1);
  std::shared_ptr<tandem::memory::HostMemoryStack> stack;
  if (allocator != "default") {
    tandem::memory::HostMemoryStackOptions o;
    if (allocator != "tandem") {
      o.tracking = true;
      o.tracking_options.report_at_exit = false;
      o.tracking_options.stacks = allocator == "tandem_stacks" ? tandem::memory::StackCapture::kAll
                                  : allocator == "tandem_sampled"
                                      ? tandem::memory::StackCapture::kSampled
                                      : tandem::memory::StackCapture::kNone;
      if (allocator != "tandem_tracking" && allocator != "tandem_stacks" &&
          allocator != "tandem_sampled") {
        std::fprintf(stderr, "unknown allocator %s\n", allocator.c_str());
        return 2;
      }
    }
    stack = tandem::memory::install_host_cpu_allocator(o, 50);
    if (!stack) {
      std::fprintf(stderr, "could not install tandem as CPU allocator\n");
      return 1;
    }
  }
  torch::manual_seed(0);
  const Step step = workload == "w1" ? make_w1() : make_heavy(warmup + steps);
  std::vector<double> ms;
  long faults = 0;
  double user_ms = 0, sys_ms = 0;
  std::int64_t allocs0 = 0, bytes0 = 0;  // tandem only: how much allocating one step does
  for (int s = 0; s < warmup + steps; ++s) {
    if (stack && s == warmup) {
      const auto st = stack->stats();
      allocs0 = st.allocations.total;
      bytes0 = st.allocated_bytes.total;
    }
    const Usage u0 = usage();
    const auto t0 = std::chrono::steady_clock::now();
    step(s);
    if (stack && stack->tracking()) stack->tracking()->mark_step();
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      const Usage u1 = usage();
      faults += u1.minor_faults - u0.minor_faults;
      user_ms += u1.user_ms - u0.user_ms;
      sys_ms += u1.sys_ms - u0.sys_ms;
    }
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double v : ms) mean += v;
  mean /= static_cast<double>(ms.size());
  double allocs_per_step = 0, mib_per_step = 0, reserved_mib = 0;
  if (stack) {
    const auto st = stack->stats();
    allocs_per_step = static_cast<double>(st.allocations.total - allocs0) / steps;
    mib_per_step = static_cast<double>(st.allocated_bytes.total - bytes0) / steps / (1 << 20);
    reserved_mib = static_cast<double>(st.reserved_bytes.peak) / (1 << 20);
  }
  std::printf(
      "{\"workload\": \"%s\", \"allocator\": \"%s\", \"steps\": %d, \"median_ms\": %.3f, "
      "\"mean_ms\": %.3f, \"min_ms\": %.3f, \"user_ms\": %.3f, \"sys_ms\": %.3f, "
      "\"minor_faults_per_step\": %.1f, "
      "\"allocations_per_step\": %.1f, \"allocated_mib_per_step\": %.2f, "
      "\"peak_rss_mib\": %.1f, \"peak_reserved_mib\": %.1f}\n",
      workload.c_str(), allocator.c_str(), steps, sorted[sorted.size() / 2], mean, sorted.front(),
      user_ms / steps, sys_ms / steps, static_cast<double>(faults) / static_cast<double>(steps),
      allocs_per_step, mib_per_step, peak_rss_mib(), reserved_mib);
  return 0;
}
