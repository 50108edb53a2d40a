// One GPU, world 1 over NCCL: step time and peak GPU memory of a 134 M-parameter MLP with AdamW
// in each of tandem's modes (bench/gpu/bench_model.h), and how long an async checkpoint save
// blocks training next to a sync save (bench/gpu/checkpoint_blocking.h). scripts/bench-gpu runs
// it next to PyTorch (bench/gpu/pytorch_gpu.py) and writes bench/results/gpu.json.
//
//   bench_gpu --out FILE [--modes plain,ddp,zero1,zero2,zero3,bf16_masters,fp16_scaler,checkpoint]
//             [--steps N] [--warmup W] [--batch B] [--checkpoint-dir DIR] [--checkpoint-repeats R]
//             [--device cuda|cpu]   (cpu: a rehearsal of the program without a GPU, over Gloo;
//                                    peak_bytes 0, no figure of it means anything)
//
// The world: tandem::init with comm.backend = nccl, a world of one without a launcher (what a
// training program gets on one GPU). Modes run one after another in the order given, each with
// its own model (seeded alike), which is freed, with the allocator's cache, before the next.
// Time: W warm-up steps, then N steps, each from a synchronised GPU to a synchronised GPU
// (torch::cuda::synchronize); step_ms is their median. Memory: peak_bytes is c10's CUDA caching
// allocator's peak of allocated bytes (what torch.cuda.max_memory_allocated reports), reset after
// the warm-up and read after the timed steps: the model, its gradients, the optimizer's state and
// the largest transient of a step, not the allocator's cache or NCCL's own buffers.
#include "bench/gpu/bench_model.h"
#include "bench/gpu/checkpoint_blocking.h"

#include "base/json.h"

#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace tandem::bench_gpu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr c10::DeviceIndex kDevice = 0;

int64_t peak_allocated_bytes() {
  if (!bench_device().is_cuda()) return 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(kDevice);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

JsonValue time_mode(const std::string& mode, const std::shared_ptr<Communicator>& world,
                    int64_t batch, int warmup, int steps) {
  const bool cuda = bench_device().is_cuda();
  if (cuda) c10::cuda::CUDACachingAllocator::emptyCache();
  ModeRunner runner(mode, world, batch);
  for (int i = 0; i < warmup; ++i) runner.step();
  synchronize();
  if (cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(kDevice);
  std::vector<double> ms;
  JsonValue per_step = JsonValue::array();
  for (int i = 0; i < steps; ++i) {
    synchronize();
    const auto t0 = Clock::now();
    runner.step();
    synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    per_step.push_back(ms.back());
  }
  JsonValue out = JsonValue::object();
  out.set("step_ms", median(ms));
  out.set("peak_bytes", peak_allocated_bytes());
  out.set("steps_ms", per_step);
  out.set("final_loss", runner.last_loss());
  out.set("parameters", runner.parameters());
  std::printf("tandem %-13s %9.3f ms/step  peak %8.1f MiB\n", mode.c_str(), median(ms),
              static_cast<double>(peak_allocated_bytes()) / (1 << 20));
  std::fflush(stdout);
  return out;
}

std::vector<std::string> split(const std::string& csv) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= csv.size()) {
    const size_t comma = csv.find(',', start);
    const std::string item = csv.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"tandem on one GPU: step time and peak memory per mode, checkpoint blocking"};
  std::string out, modes_csv = "plain,ddp,zero1,zero2,zero3,bf16_masters,fp16_scaler,checkpoint";
  std::string checkpoint_dir = "bench_gpu_checkpoints";
  int steps = 20, warmup = 5, repeats = 2;
  int64_t batch = 64;
  app.add_option("--out", out, "JSON file to write")->required();
  app.add_option("--modes", modes_csv, "comma-separated modes, run in this order");
  app.add_option("--steps", steps, "timed steps per mode")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "rows per step")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", checkpoint_dir, "where the checkpoint mode saves");
  app.add_option("--checkpoint-repeats", repeats, "saves per kind")->check(CLI::PositiveNumber);
  std::string device = "cuda";
  app.add_option("--device", device, "cuda; cpu rehearses the program without a GPU")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  CLI11_PARSE(app, argc, argv);

  if (device == "cpu") {
    set_bench_device(c10::Device(c10::kCPU));
  } else if (!torch::cuda::is_available()) {
    std::cerr << "bench_gpu: no CUDA device (torch::cuda::is_available() is false)\n";
    return 1;
  }
  InitOptions init_options = InitOptions::from_env();
  init_options.backend = device == "cpu" ? "gloo" : "nccl";
  Distributed dist = init(init_options);
  if (dist.world->size() != 1) {
    std::cerr << "bench_gpu: runs at world 1 (got " << dist.world->size() << " ranks)\n";
    return 1;
  }

  JsonValue result = JsonValue::object();
  result.set("device", bench_device().str());
  result.set("backend", dist.world->backend());
  result.set("steps", steps);
  result.set("warmup", warmup);
  result.set("batch", batch);
  JsonValue modes = JsonValue::object();
  for (const std::string& mode : split(modes_csv)) {
    if (mode == "checkpoint") {
      const CheckpointBlocking c = measure_checkpoint_blocking(dist.world, batch, checkpoint_dir,
                                                               repeats);
      JsonValue j = JsonValue::object();
      j.set("step_ms", c.step_ms);
      j.set("sync_save_ms", c.sync_save_ms);
      j.set("async_call_ms", c.async_call_ms);
      j.set("async_blocking_ms", c.async_blocking_ms);
      j.set("bytes", static_cast<uint64_t>(c.bytes));
      j.set("repeats", repeats);
      result.set("checkpoint", j);
      std::printf("tandem checkpoint: sync save %.1f ms, async save blocks %.1f ms (call %.1f ms)\n",
                  c.sync_save_ms, c.async_blocking_ms, c.async_call_ms);
    } else {
      modes.set(mode, time_mode(mode, dist.world, batch, warmup, steps));
    }
  }
  result.set("modes", modes);
  std::ofstream file(out);
  file << result.dump(2) << "\n";
  if (!file) {
    std::cerr << "bench_gpu: cannot write " << out << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::bench_gpu

int main(int argc, char** argv) {
  try {
    return tandem::bench_gpu::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu: " << e.what() << std::endl;
    return 1;
  }
}
