// (b) W1 end to end: one training step of an MLP 1024 -> 4x2048 ReLU -> 1024, MSE, SGD, fp32,
// batch 32, one thread, with libtorch's CPU allocator chosen by --allocator:
//   default           libtorch's own (posix_memalign; jemalloc when LD_PRELOADed by the script)
//   tandem            HostMemoryStack (Statistics(CachingPool(HostBackend))) installed
//   tandem_tracking   + TrackingResource without stacks
//   tandem_sampled    + TrackingResource, stacks sampled 1 in 64
//   tandem_stacks     + TrackingResource, stack of every allocation
// Prints one JSON object: median/mean step time and minor page faults per step.
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <tandem/memory/cpu_allocator.h>

struct Mlp : torch::nn::Module {
  Mlp() {
    layers.push_back(register_module("in", torch::nn::Linear(1024, 2048)));
    for (int i = 0; i < 3; ++i) layers.push_back(register_module("h" + std::to_string(i), torch::nn::Linear(2048, 2048)));
    out = register_module("out", torch::nn::Linear(2048, 1024));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l->forward(x));
    return out->forward(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear out{nullptr};
};

static long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

int main(int argc, char** argv) {
  std::string allocator = "default";
  int steps = 30, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--allocator=", 0) == 0) allocator = a.substr(12);
    else if (a.rfind("--steps=", 0) == 0) steps = std::stoi(a.substr(8));
    else if (a.rfind("--warmup=", 0) == 0) warmup = std::stoi(a.substr(9));
    else {
      std::fprintf(stderr, "usage: %s [--allocator=default|tandem|tandem_tracking|tandem_sampled|tandem_stacks] "
                   "[--steps=N] [--warmup=N]\n", argv[0]);
      return 2;
    }
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
      if (allocator != "tandem_tracking" && allocator != "tandem_stacks" && allocator != "tandem_sampled") {
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
  auto model = std::make_shared<Mlp>();
  torch::optim::SGD opt(model->parameters(), 0.01);
  auto x = torch::randn({32, 1024});
  auto y = torch::randn({32, 1024});
  std::vector<double> ms;
  long faults = 0;
  std::int64_t allocs0 = 0, bytes0 = 0;  // tandem only: how much allocating one step does
  for (int s = 0; s < warmup + steps; ++s) {
    if (stack && s == warmup) {
      const auto st = stack->stats();
      allocs0 = st.allocations.total;
      bytes0 = st.allocated_bytes.total;
    }
    const long f0 = minor_faults();
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    opt.step();
    if (stack && stack->tracking()) stack->tracking()->mark_step();
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      faults += minor_faults() - f0;
    }
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double v : ms) mean += v;
  mean /= static_cast<double>(ms.size());
  double allocs_per_step = 0, mib_per_step = 0;
  if (stack) {
    const auto st = stack->stats();
    allocs_per_step = static_cast<double>(st.allocations.total - allocs0) / steps;
    mib_per_step = static_cast<double>(st.allocated_bytes.total - bytes0) / steps / (1 << 20);
  }
  std::printf("{\"allocator\": \"%s\", \"steps\": %d, \"median_ms\": %.3f, \"mean_ms\": %.3f, \"min_ms\": %.3f, "
              "\"minor_faults_per_step\": %.1f, \"allocations_per_step\": %.1f, "
              "\"allocated_mib_per_step\": %.2f}\n",
              allocator.c_str(), steps, sorted[sorted.size() / 2], mean, sorted.front(),
              static_cast<double>(faults) / static_cast<double>(steps), allocs_per_step, mib_per_step);
  return 0;
}
