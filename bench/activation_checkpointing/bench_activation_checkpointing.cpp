// Activation checkpointing: peak activation memory and step time of one training step per
// checkpoint policy. scripts/bench-activation-checkpointing runs it next to torch.utils.checkpoint
// (bench/activation_checkpointing/pytorch_checkpoint.py) and writes
// bench/results/activation_checkpointing.json.
//
//   bench_activation_checkpointing --policy {none|every|sqrt} [--memory {tandem|rss}]
//       [--blocks 16] [--batch 4096] [--dim 128] [--steps N] [--warmup W] [--out FILE]
//
// Model: `blocks` identical pre-norm MLP blocks (the feed-forward half of a transformer block),
// y = x + fc2(silu(fc1(layer_norm(x)))), fc1: dim -> 4*dim, fc2: 4*dim -> dim, in a
// torch::nn::Sequential; input [batch, dim] random, target random; loss MSE; SGD lr 1e-3. One
// step = forward, loss, backward, optimizer step, zero_grad. One compute thread
// (at::set_num_threads(1)).
// Policies (tandem::CheckpointedSequential): none; every = ActivationCheckpointPolicy::every(1)
// (each block its own checkpoint, the last block unchecked); sqrt =
// ActivationCheckpointPolicy::sqrt() (round(√16) = 4 runs of 4 blocks, the last run unchecked).
// These are what torch.utils.checkpoint. checkpoint_sequential(model, 16) and (model, 4) do.
//
// --memory tandem (default): tandem's caching allocator (HostMemoryStack with statistics) is
//   installed as libtorch's CPU allocator before the first tensor. For each timed step: reset the
//   peaks, note allocated bytes, run the step; peak_bytes = allocated peak during the step minus
//   allocated before it (gradients of the parameters exist from the warm-up on, so the figure is
//   what the step itself needs: activations, their gradients and temporaries).
//   peak_requested_bytes is the same with the bytes libtorch asked for (before the pool rounds
//   them up; each includes tandem's 64-byte tensor header).
// --memory rss: libtorch's default allocator, and peak_rss_bytes = peak resident set size during
//   the step (VmHWM after the step, reset through /proc/self/clear_refs before it) minus the
//   resident size before it. Run with MALLOC_MMAP_THRESHOLD_=65536 so glibc maps every large
//   block fresh and unmaps it on free; this is how pytorch_checkpoint.py measures Python, so this
//   mode checks that method against the allocator's figures.
// step_ms is the median of the timed steps (steady_clock). Prints one line, writes one JSON object.
#include <tandem/memory/cpu_allocator.h>
#include <tandem/memory/host_memory_stack.h>
#include <tandem/runtime/activation_checkpoint.h>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::silu(fc1(ln(x)))); }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::int64_t status_bytes(const char* key) {  // VmRSS / VmHWM from /proc/self/status
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, k.size(), k) == 0) return std::stoll(line.substr(k.size())) * 1024;
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out.flush());
}

std::string join(const std::vector<double>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}
std::string join(const std::vector<std::int64_t>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Activation checkpointing: peak activation memory and step time per policy"};
  std::string policy_name = "none", memory = "tandem", out;
  int64_t blocks = 16, batch = 4096, dim = 128;
  int steps = 5, warmup = 2;
  app.add_option("--policy", policy_name, "none | every | sqrt")
      ->check(CLI::IsMember({"none", "every", "sqrt"}));
  app.add_option("--memory", memory, "tandem (allocator statistics) | rss (peak resident size)")
      ->check(CLI::IsMember({"tandem", "rss"}));
  app.add_option("--blocks", blocks, "identical blocks")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "rows per step")->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "model width (hidden = 4 * dim)")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--out", out, "JSON file (empty: stdout only)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // Before the first tensor, so every CPU allocation goes through tandem.
  std::shared_ptr<tandem::memory::HostMemoryStack> mem;
  if (memory == "tandem") {
    mem = tandem::memory::install_host_cpu_allocator({}, /*priority=*/50);
    if (!mem) {
      std::cerr << "bench_activation_checkpointing: could not install tandem's CPU allocator\n";
      return 1;
    }
  }
  at::set_num_threads(1);
  torch::manual_seed(0);

  torch::nn::Sequential seq;
  for (int64_t i = 0; i < blocks; ++i) seq->push_back(Block(dim));
  tandem::ActivationCheckpointPolicy policy = tandem::ActivationCheckpointPolicy::none();
  if (policy_name == "every") policy = tandem::ActivationCheckpointPolicy::every(1);
  if (policy_name == "sqrt") policy = tandem::ActivationCheckpointPolicy::sqrt();
  tandem::CheckpointedSequential model(seq, policy);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-3));
  const auto x = torch::randn({batch, dim});
  const auto y = torch::randn({batch, dim});

  std::vector<double> step_ms, forward_ms, backward_ms;
  std::vector<std::int64_t> peaks, requested_peaks, before_bytes, rss_peaks;
  for (int s = 0; s < warmup + steps; ++s) {
    const bool timed = s >= warmup;
    std::int64_t before = 0, before_requested = 0, rss_before = 0;
    if (mem) {
      mem->pool().reset_peak();
      if (mem->statistics()) mem->statistics()->reset_peak();
      const auto st = mem->stats();
      before = st.allocated_bytes.current;
      before_requested = st.requested_bytes.current;
    } else {
      if (!reset_peak_rss()) {
        std::cerr << "bench_activation_checkpointing: cannot write /proc/self/clear_refs\n";
        return 1;
      }
      rss_before = status_bytes("VmRSS");
    }
    const auto t0 = Clock::now();
    auto loss = torch::mse_loss(model(x), y);
    const auto t1 = Clock::now();
    loss.backward();
    const auto t2 = Clock::now();
    opt.step();
    opt.zero_grad();
    const auto t3 = Clock::now();
    loss = torch::Tensor();
    if (!timed) continue;
    step_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t0).count());
    forward_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    backward_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    if (mem) {
      const auto st = mem->stats();
      peaks.push_back(st.allocated_bytes.peak - before);
      requested_peaks.push_back(st.requested_bytes.peak - before_requested);
      before_bytes.push_back(before);
    } else {
      rss_peaks.push_back(status_bytes("VmHWM") - rss_before);
    }
  }

  auto max_of = [](const std::vector<std::int64_t>& v) {
    return v.empty() ? std::int64_t{0} : *std::max_element(v.begin(), v.end());
  };
  std::ostringstream json;
  json << "{\n  \"policy\": \"" << policy_name << "\",\n  \"plan\": \"" << model->describe()
       << "\",\n  \"memory\": \"" << memory << "\",\n  \"blocks\": " << blocks
       << ",\n  \"batch\": " << batch << ",\n  \"dim\": " << dim << ",\n  \"warmup\": " << warmup
       << ",\n  \"steps\": " << steps << ",\n  \"step_ms\": " << median(step_ms)
       << ",\n  \"forward_ms\": " << median(forward_ms) << ",\n  \"backward_ms\": "
       << median(backward_ms) << ",\n  \"steps_ms\": [" << join(step_ms) << "]";
  if (mem) {
    json << ",\n  \"peak_bytes\": " << max_of(peaks) << ",\n  \"peak_requested_bytes\": "
         << max_of(requested_peaks) << ",\n  \"peaks_bytes\": [" << join(peaks)
         << "],\n  \"allocated_before_step_bytes\": " << max_of(before_bytes);
  } else {
    json << ",\n  \"peak_rss_bytes\": " << max_of(rss_peaks) << ",\n  \"peaks_rss_bytes\": ["
         << join(rss_peaks) << "]";
  }
  json << "\n}\n";
  std::printf("%-6s %-7s step %8.1f ms (fwd %7.1f, bwd %7.1f)  peak %8.1f MiB  [%s]\n",
              policy_name.c_str(), memory.c_str(), median(step_ms), median(forward_ms),
              median(backward_ms),
              static_cast<double>(mem ? max_of(peaks) : max_of(rss_peaks)) / (1 << 20),
              model->describe().c_str());
  if (!out.empty()) {
    std::ofstream f(out);
    f << json.str();
    if (!f) {
      std::cerr << "bench_activation_checkpointing: cannot write " << out << "\n";
      return 1;
    }
  } else {
    std::cout << json.str();
  }
  return 0;
}
