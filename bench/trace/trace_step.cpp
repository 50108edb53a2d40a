// bench_trace_step: what recording a timeline costs the main job's training step.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/bench_trace_step
//     --config examples/configs/train_lm.yaml [--blocks 60] [--block-steps 10] [--json FILE]
//
// Trains examples/train_lm.cpp's model on its config, step for step as train_lm does, and switches
// the recorder in blocks of --block-steps steps in a fixed rotation: off, on, control (off again),
// after 20 untimed warm-up steps. Every mode runs in the same processes, interleaved, so load
// changes on a shared machine hit them alike. Rank 0 prints (and writes to --json) the median step
// time per mode, overhead = on / off - 1 and control = control / off - 1 (an A/A split of untraced
// steps: the noise floor), the same for the training thread's CPU time per step (what recording
// adds to its own work, without the waits for a core that dominate wall time on a loaded machine),
// and the events recorded per step and rank. A step is timed from its batch to its loss value
// (forward, backward with the gradient all-reduce, optimizer step).
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <unistd.h>
#include <vector>

#include "examples/tiny_lm.h"  // examples/: the main job's model and data

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CPU time of the calling thread: what the recorder adds to the training thread's own work,
// without the waits for a core that dominate wall time on a loaded machine.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app("bench_trace_step: the timeline recorder's cost per training step");
    int64_t blocks = 60, block_steps = 10, warmup = 20;
    std::string json;
    app.add_option("--blocks", blocks, "blocks of steps (a rotation off, on, control)")
        ->check(CLI::Range(int64_t{3}, int64_t{1} << 20));
    app.add_option("--block-steps", block_steps, "steps per block")->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
    app.add_option("--json", json, "rank 0 writes the results here");
    try {
      app.parse(ctx.argc(), ctx.argv());
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    if (ctx.config().trace.enabled) {
      throw tandem::ConfigError("bench_trace_step switches the recorder itself; run it without "
                                "--trace-dir / trace.enabled");
    }
    at::set_num_threads(1);
    const auto& train = ctx.config().train;
    const int rank = ctx.rank();
    tiny_lm::LmConfig lm;
    const auto data = tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 18, train.seed));
    torch::manual_seed(train.seed);
    tiny_lm::TinyLm model(lm);
    tandem::DistributedDataParallel ddp(model, ctx.world(), ctx.config().ddp);
    torch::optim::AdamW opt(model->parameters(),
                            torch::optim::AdamWOptions(train.lr).weight_decay(train.weight_decay));
    char tmpl[] = "/tmp/bench-trace-step-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw tandem::Error("bench_trace_step: mkdtemp failed");
    tandem::TraceOptions trace_options;
    trace_options.enabled = true;
    trace_options.dir = std::string(tmpl) + "/rank" + std::to_string(rank);

    const char* modes[] = {"off", "on", "control"};
    std::vector<double> ms[3], cpu_ms[3];
    int64_t traced_events = 0, traced_steps = 0;
    int64_t step = 0;
    auto train_step = [&] {
      auto windows = tiny_lm::batch_windows(data, train.batch_size, lm.context, train.seed, step++, rank);
      opt.zero_grad();
      auto loss = tiny_lm::lm_loss(ddp(tiny_lm::lm_inputs(windows)), windows);
      loss.backward();
      opt.step();
      tandem::heartbeat();
      return loss.item<double>();
    };
    for (int64_t i = 0; i < warmup; ++i) train_step();
    for (int64_t b = 0; b < blocks; ++b) {
      const int mode = static_cast<int>(b % 3);
      if (mode == 1) tandem::trace::start(trace_options, rank);
      for (int64_t i = 0; i < block_steps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = thread_cpu_ms();
        train_step();
        cpu_ms[mode].push_back(thread_cpu_ms() - c0);
        ms[mode].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      if (mode == 1) {
        traced_events += tandem::trace::stats().recorded;
        traced_steps += block_steps;
        tandem::trace::stop();  // writing the file is not part of a step
      }
    }
    std::system(("rm -rf '" + std::string(tmpl) + "'").c_str());
    if (rank != 0) return 0;
    const double off = median(ms[0]), on = median(ms[1]), control = median(ms[2]);
    const double cpu_off = median(cpu_ms[0]), cpu_on = median(cpu_ms[1]), cpu_control = median(cpu_ms[2]);
    const double events = traced_steps > 0 ? static_cast<double>(traced_events) / traced_steps : 0;
    std::printf("%-10s %10s %12s %8s\n", "recorder", "step ms", "thread cpu ms", "steps");
    for (int m = 0; m < 3; ++m) {
      std::printf("%-10s %10.2f %12.2f %8zu\n", modes[m], median(ms[m]), median(cpu_ms[m]), ms[m].size());
    }
    std::printf("overhead (on / off - 1): wall %+.2f%%, thread cpu %+.2f%%; noise floor (control / "
                "off - 1): wall %+.2f%%, thread cpu %+.2f%%; %.1f events per step on rank 0\n",
                (on / off - 1) * 100, (cpu_on / cpu_off - 1) * 100, (control / off - 1) * 100,
                (cpu_control / cpu_off - 1) * 100, events);
    if (!json.empty()) {
      std::FILE* f = std::fopen(json.c_str(), "w");
      if (f == nullptr) throw tandem::Error("bench_trace_step: cannot write " + json);
      std::fprintf(f,
                   "{\"steps_per_mode\":%zu,\"block_steps\":%lld,\"step_ms\":{\"off\":%.3f,"
                   "\"on\":%.3f,\"control\":%.3f},\"overhead\":%.5f,\"control\":%.5f,"
                   "\"thread_cpu_ms\":{\"off\":%.3f,\"on\":%.3f,\"control\":%.3f},"
                   "\"overhead_cpu\":%.5f,\"control_cpu\":%.5f,\"events_per_step\":%.2f}\n",
                   ms[1].size(), static_cast<long long>(block_steps), off, on, control,
                   on / off - 1, control / off - 1, cpu_off, cpu_on, cpu_control,
                   cpu_on / cpu_off - 1, cpu_control / cpu_off - 1, events);
      std::fclose(f);
    }
    return 0;
  });
}
