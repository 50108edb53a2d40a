// Worker for the timeline process test: trains a small MLP with DistributedDataParallel while
// recording a timeline (TANDEM_TRACE_DIR, as tandemrun --trace-dir sets it) and logging metrics.
//   trace_worker STEPS [METRICS_FILE] [HIDDEN] [alternate]
// Prints "TRACE <path>" for the file it wrote and, on rank 0, "STEP_US_MEDIAN <us>" (the median
// step time).
//   trace_worker pipeline CKPT_DIR
// trains a 2-stage 1F1B pipeline for 3 steps and saves one checkpoint (pipeline and checkpoint
// spans). With `alternate` (for the overhead figure in docs/timeline.md) tracing is switched
// on and off every 10 steps (off first: warm-up untraced) in the same process and rank 0 prints
// "STEP_US_MEDIAN off <us> on <us>"; exit codes as worker_main.h.
#include "tests/multiprocess/worker_main.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <vector>
#include <string>

namespace {

int pipeline_scenario(tandem::Distributed& dist, const std::string& ckpt_dir) {
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::Tanh(), torch::nn::Linear(64, 4));
  tandem::PipelineOptions options;
  options.schedule = "1f1b";
  options.num_microbatches = 4;
  tandem::PipelineParallel pipe(model, dist.world, options);
  torch::optim::SGD opt(pipe.parameters(), 0.01);
  tandem::CheckpointManagerOptions ckpt_options;
  ckpt_options.directory = ckpt_dir;
  ckpt_options.async = false;
  ckpt_options.communicator = dist.world;
  tandem::CheckpointManager ckpt(ckpt_options);
  auto params = pipe.parameters();
  ckpt.add_tensors(
      "stage",
      [&] {
        std::map<std::string, at::Tensor> m;
        for (size_t i = 0; i < params.size(); ++i) m["p" + std::to_string(i)] = params[i];
        return m;
      },
      [](const std::map<std::string, at::Tensor>&) {}, tandem::Sharding::kSharded);
  for (int step = 1; step <= 3; ++step) {
    auto gen = at::detail::createCPUGenerator(step);
    auto x = at::randn({32, 16}, gen);
    auto y = at::randn({32, 4}, gen);
    opt.zero_grad();
    pipe.train_step(x, y, [](const at::Tensor& out, const at::Tensor& t) {
      return torch::mse_loss(out, t);
    });
    opt.step();
  }
  ckpt.save(3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "pipeline") {
    const std::string ckpt_dir = argv[2];
    return tandem::testing::run_worker([&](tandem::Distributed& dist) {
      tandem::TraceOptions trace_options;
      if (const char* dir = std::getenv("TANDEM_TRACE_DIR")) {
        trace_options.enabled = true;
        trace_options.dir = dir;
      }
      tandem::trace::start(trace_options, dist.env.rank);
      const int rc = pipeline_scenario(dist, ckpt_dir);
      std::printf("TRACE %s\n", tandem::trace::stop().c_str());
      return rc;
    });
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 6;
  const std::string metrics_file = argc > 2 ? argv[2] : "";
  const int64_t hidden = argc > 3 ? std::atoi(argv[3]) : 64;
  const bool alternate = argc > 4 && std::string(argv[4]) == "alternate";
  return tandem::testing::run_worker([&](tandem::Distributed& dist) {
    // The config system maps TANDEM_TRACE_DIR to trace.*; this worker reads it directly.
    tandem::TraceOptions trace_options;
    if (const char* dir = std::getenv("TANDEM_TRACE_DIR")) {
      trace_options.enabled = true;
      trace_options.dir = dir;
    }
    if (!alternate) tandem::trace::start(trace_options, dist.env.rank);  // else from step 11
    torch::manual_seed(1);
    auto model = torch::nn::Sequential(torch::nn::Linear(16, hidden), torch::nn::ReLU(),
                                       torch::nn::Linear(hidden, hidden), torch::nn::Tanh(),
                                       torch::nn::Linear(hidden, 4));
    tandem::DistributedDataParallelOptions options;
    options.bucket_cap_mb = 0.01;  // several buckets
    options.first_bucket_cap_mb = 0.002;
    tandem::DistributedDataParallel ddp(model, dist.world, options);
    torch::optim::SGD opt(model->parameters(), 0.01);
    tandem::MetricsOptions metrics;
    metrics.log_every = 2;
    metrics.file = metrics_file;
    tandem::ProgressLogger logger(metrics, steps, dist.env.rank, dist.world->size());
    logger.track_overlap(ddp.reducer());
    std::vector<int64_t> step_us, traced_us;
    for (int step = 1; step <= steps; ++step) {
      if (alternate && step % 10 == 1 && step > 1) {
        if (tandem::trace::enabled()) {
          tandem::trace::stop();
        } else {
          tandem::trace::start(trace_options, dist.env.rank);
        }
      }
      // By block parity, so a run without TANDEM_TRACE_DIR is the A/A control.
      const bool traced = alternate ? ((step - 1) / 10) % 2 == 1 : tandem::trace::enabled();
      const auto t0 = std::chrono::steady_clock::now();
      auto gen = at::detail::createCPUGenerator(1000 * step + dist.env.rank);
      auto x = at::randn({32, 16}, gen);
      auto y = at::randn({32, 4}, gen);
      auto loss = torch::mse_loss(ddp(x), y);
      loss.backward();
      opt.step();
      opt.zero_grad();
      logger.step(step, loss.item<double>(), 32);
      const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
      (alternate && traced ? traced_us : step_us).push_back(us);
    }
    auto median = [](std::vector<int64_t> v) -> long long {
      if (v.empty()) return -1;
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    if (dist.env.rank == 0 && alternate) {
      std::printf("STEP_US_MEDIAN off %lld on %lld\n", median(step_us), median(traced_us));
    } else if (dist.env.rank == 0) {
      std::printf("STEP_US_MEDIAN %lld\n", median(step_us));
    }
    const std::string path = tandem::trace::stop();
    std::printf("TRACE %s\n", path.c_str());
    return 0;
  });
}
