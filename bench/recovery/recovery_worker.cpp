// The training program of scripts/bench-recovery, run under tandemrun and under torchrun alike.
// A small real job (tandem::init, DistributedDataParallel over an MLP, SGD, CheckpointManager every
// K steps, resume at start) that prints wall-clock (CLOCK_REALTIME) timestamps, so the script can
// measure the time from a worker's death to the first step completed after the group restarted:
//   "recovery kill t=<s>"                          just before rank R SIGKILLs itself at step S
//                                                  (restart 0 only)
//   "recovery start restart <n> t=<s>"             rank 0, on entering main (libraries loaded)
//   "recovery step <s> restart <n> t=<s>"          rank 0, after each completed step
//   recovery_worker --ckpt DIR [--steps N] [--every K] [--kill-rank R] [--kill-step S]
#include <ATen/CPUGeneratorImpl.h>
#include <signal.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/init.h>
#include <tandem/runtime/run_main.h>
#include <time.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "tests/fault/training_args.h"

namespace {

double wall_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Args : tandem::testing::TrainingArgs {
  int kill_rank = 1;
  int64_t kill_step = 12;
};

Args parse(int argc, char** argv) {
  Args a;
  a.steps = 20;
  a.every = 5;
  CLI::App app("recovery_worker: the training program of scripts/bench-recovery");
  tandem::testing::add_training_args(app, a);
  app.get_option("--ckpt")->required();
  app.add_option("--kill-rank", a.kill_rank, "the rank that SIGKILLs itself (restart 0 only)");
  app.add_option("--kill-step", a.kill_step, "the step it does so at");
  app.parse(argc, argv);
  return a;
}

int train(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const char* restart_env = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const std::string restart = restart_env != nullptr ? restart_env : "0";
  const char* rank_env = std::getenv("RANK");
  if (rank_env == nullptr || std::string(rank_env) == "0") {
    std::printf("recovery start restart %s t=%.6f\n", restart.c_str(), wall_seconds());
    std::fflush(stdout);
  }
  auto dist = tandem::init();
  const int rank = dist.world->rank();

  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::Tanh(),
                              torch::nn::Linear(256, 8));
  tandem::DistributedDataParallel ddp(model, dist.world, tandem::DistributedDataParallelOptions{});
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  tandem::CheckpointManagerOptions ckpt_options;
  ckpt_options.directory = args.ckpt;
  ckpt_options.every_n_steps = args.every;
  ckpt_options.keep_last = 2;
  ckpt_options.communicator = dist.world;
  tandem::CheckpointManager ckpt(ckpt_options);
  ckpt.add_module("model", *model);
  ckpt.add_optimizer("optim", opt);

  for (int64_t step = ckpt.resume(); step < args.steps; ++step) {
    if (restart == "0" && rank == args.kill_rank && step == args.kill_step) {
      std::printf("recovery kill t=%.6f\n", wall_seconds());
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 * rank + step));
    auto x = at::randn({32, 64}, gen);
    auto y = at::randn({32, 8}, gen);
    torch::mse_loss(ddp(x), y).backward();
    opt.step();
    opt.zero_grad();
    ckpt.maybe_save(step + 1);
    if (rank == 0) {
      std::printf("recovery step %lld restart %s t=%.6f\n", static_cast<long long>(step),
                  restart.c_str(), wall_seconds());
      std::fflush(stdout);
    }
  }
  ckpt.wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return tandem::run_main(argc, argv, train); }
