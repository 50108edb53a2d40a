#include "bench/gpu/checkpoint_blocking.h"

#include "bench/gpu/bench_model.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tandem::bench_gpu {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One step, from a synchronised GPU to a synchronised GPU, in ms.
double timed_step(ModeRunner& runner) {
  synchronize();
  const auto t0 = Clock::now();
  runner.step();
  synchronize();
  return ms_since(t0);
}

CheckpointManagerOptions options(std::shared_ptr<Communicator> world, const std::string& dir,
                                 bool async) {
  CheckpointManagerOptions o;
  o.directory = dir;
  o.async = async;
  o.keep_last = 1;
  o.communicator = std::move(world);
  return o;
}

}  // namespace

CheckpointBlocking measure_checkpoint_blocking(std::shared_ptr<Communicator> world, int64_t batch,
                                               const std::string& directory, int repeats) {
  ModeRunner runner("ddp", world, batch);
  for (int i = 0; i < 3; ++i) timed_step(runner);  // AdamW's state exists from the first step
  std::vector<double> steps;
  for (int i = 0; i < 5; ++i) steps.push_back(timed_step(runner));
  CheckpointBlocking result;
  result.step_ms = median(steps);

  std::vector<double> sync_ms, call_ms, blocking_ms;
  {
    CheckpointManager ckpt(options(world, directory + "/sync", false));
    runner.register_checkpoint(ckpt);
    for (int i = 0; i < repeats; ++i) {
      synchronize();
      const auto t0 = Clock::now();
      ckpt.save(i + 1);
      sync_ms.push_back(ms_since(t0));
      result.bytes = ckpt.last_save_stats().bytes;
      timed_step(runner);
    }
  }
  {
    CheckpointManager ckpt(options(world, directory + "/async", true));
    runner.register_checkpoint(ckpt);
    for (int i = 0; i < repeats; ++i) {
      synchronize();
      const auto t0 = Clock::now();
      ckpt.save(i + 1);
      const double call = ms_since(t0);
      const double after = timed_step(runner);
      ckpt.wait();
      call_ms.push_back(call);
      blocking_ms.push_back(call + std::max(0.0, after - result.step_ms));
    }
  }
  result.sync_save_ms = median(sync_ms);
  result.async_call_ms = median(call_ms);
  result.async_blocking_ms = median(blocking_ms);
  return result;
}

}  // namespace tandem::bench_gpu
