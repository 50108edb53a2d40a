// The training worker of the fault-injection tests (tests/fault/fault_test.cpp), started by
// tandemrun. A real, small training job: tandem::init(), DistributedDataParallel over a tiny MLP,
// SGD with momentum, CheckpointManager (model, optimizer, ddp.state() sharded) every K steps,
// resume() at start, tandem::run_main + tandem::heartbeat() each step. The data of step s depends
// only on s and the rank, so a run that is killed and resumed ends with the same parameters, bit
// for bit, as one that was not.
//
//   fault_worker --ckpt DIR --out FILE [--steps N] [--every K] [--sync]
//     rank 0 writes the final parameters' raw bytes to FILE.
//   fault_worker --throw-now
//     throws std::runtime_error("thrown before init") at once (tests run_main's error file).
//   fault_worker --time-init
//     runs tandem::init() only; when it throws, prints "init failed after <s> s: <what>" and
//     exits 1 (times the store-connect timeout without the program's start-up).
//
// Fault injection (environment): FAULT_RANK=r FAULT_STEP=s FAULT_KIND=k makes rank r, at the start
// of step s, on restart 0 only (TORCHELASTIC_RESTART_COUNT=0):
//   kill   SIGKILL itself           raise  throw std::runtime_error("injected failure at step s")
//   stop   SIGSTOP itself (a hang)  segv   raise(SIGSEGV)
//   always-raise   like raise, but on every restart (an unrecoverable job)
//   permanent      throw the program's own tandem::Error whose restartable() is false, with a
//                  message in none of the words tandemrun ever matched
// Before a fault it prints "fault <kind> at step <s> pid <pid>" (flushed).
// FAULT_FORGET_OPTIMIZER=1 leaves the optimizer out of the checkpoint (the negative control: a
// resume that loses the momentum must NOT end bit-identical).
#include <ATen/CPUGeneratorImpl.h>
#include <signal.h>
#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/init.h>
#include <tandem/runtime/run_main.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tests/fault/training_args.h"

namespace {

struct Args : tandem::testing::TrainingArgs {
  bool sync = false;
  bool throw_now = false;
  bool time_init = false;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("fault_worker: the training worker of tests/fault");
  tandem::testing::add_training_args(app, a);
  app.add_flag("--sync", a.sync, "save checkpoints synchronously");
  app.add_flag("--throw-now", a.throw_now, "throw at once, before tandem::init()");
  app.add_flag("--time-init", a.time_init, "time tandem::init() and report how it failed");
  app.parse(argc, argv);
  return a;
}

// A program's own error that no restart can fix, known to tandemrun only by restartable().
class ModelFormatError : public tandem::Error {
 public:
  using tandem::Error::Error;
  bool restartable() const noexcept override { return false; }
};

std::string env_or(const char* key, const char* fallback) {
  const char* v = std::getenv(key);
  return v != nullptr ? v : fallback;
}

void maybe_fault(int rank, int64_t step) {
  const std::string kind = env_or("FAULT_KIND", "");
  if (kind.empty() || std::stoi(env_or("FAULT_RANK", "-1")) != rank ||
      std::stoll(env_or("FAULT_STEP", "-1")) != step)
    return;
  const bool first_attempt = env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0";
  if (kind != "always-raise" && !first_attempt) return;
  std::printf("fault %s at step %lld pid %d\n", kind.c_str(), static_cast<long long>(step),
              static_cast<int>(::getpid()));
  std::fflush(stdout);
  if (kind == "kill") ::raise(SIGKILL);
  if (kind == "stop") ::raise(SIGSTOP);
  if (kind == "segv") ::raise(SIGSEGV);
  if (kind == "raise" || kind == "always-raise")
    throw std::runtime_error("injected failure at step " + std::to_string(step));
  if (kind == "permanent") throw ModelFormatError("the weights are of format 3; this build reads 2");
}

std::pair<at::Tensor, at::Tensor> batch(int rank, int64_t step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + 97 * rank + step));
  return {at::randn({8, 10}, gen), at::randn({8, 3}, gen)};
}

int train(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (args.throw_now) throw std::runtime_error("thrown before init");
  if (args.time_init) {
    const auto start = std::chrono::steady_clock::now();
    try {
      tandem::init();
    } catch (const std::exception& e) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      std::printf("init failed after %.3f s: %s\n", took.count(), e.what());
      return 1;
    }
    return 0;
  }
  auto dist = tandem::init();
  const int rank = dist.world->rank();

  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(10, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 3));
  tandem::DistributedDataParallelOptions dp_options;
  dp_options.bucket_cap_mb = 0.0005;  // several buckets: the plan is real state
  tandem::DistributedDataParallel ddp(model, dist.world, dp_options);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  tandem::CheckpointManagerOptions ckpt_options;
  ckpt_options.directory = args.ckpt;
  ckpt_options.every_n_steps = args.every;
  ckpt_options.keep_last = 3;
  ckpt_options.async = !args.sync;
  ckpt_options.communicator = dist.world;
  tandem::CheckpointManager ckpt(ckpt_options);
  ckpt.add_module("model", *model);
  if (env_or("FAULT_FORGET_OPTIMIZER", "0") != "1") ckpt.add_optimizer("optim", opt);
  ckpt.add_tensors(
      "ddp", [&] { return ddp.state(); },
      [&](const std::map<std::string, at::Tensor>& s) { ddp.load_state(s); },
      tandem::Sharding::kSharded);

  const int64_t start = ckpt.resume();
  std::printf("restart %s resumed at step %lld\n",
              env_or("TORCHELASTIC_RESTART_COUNT", "?").c_str(), static_cast<long long>(start));
  std::fflush(stdout);
  for (int64_t step = start; step < args.steps; ++step) {
    maybe_fault(rank, step);
    auto [x, y] = batch(rank, step);
    auto loss = torch::mse_loss(ddp(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    tandem::heartbeat();
    ckpt.maybe_save(step + 1);
  }
  ckpt.wait();

  if (rank == 0) {
    std::ofstream out(args.out, std::ios::binary | std::ios::trunc);
    for (const auto& p : model->parameters()) {
      const auto c = p.detach().contiguous();
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    }
    if (!out) throw std::runtime_error("cannot write " + args.out);
  }
  std::printf("done %lld steps\n", static_cast<long long>(args.steps));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return tandem::run_main(argc, argv, train); }
