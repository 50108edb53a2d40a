// The training program of scripts/bench-ft: the same job for step-level fault tolerance
// (tandemrun --ft-replace, --set ft.enabled=true) and for today's restart from the newest
// checkpoint (plain tandemrun --max-restarts, --every K). An MLP of --layers Linear(width, width)
// with ReLU between (default 6 x 4096: 100.7 M fp32 parameters), DistributedDataParallel over
// tandem::FaultTolerantWorld's communicator, SGD with momentum (so a heal sends parameters and
// momentum), CheckpointManager registering model, optimizer and RNG, a small deterministic batch
// per rank (4 x width, seeded by step and rank in the epoch). The script SIGKILLs workers; the
// program itself injects nothing.
//
//   ft_bench_worker --ckpt DIR --stop-file PATH [--every K] [--width W] [--layers L] [--steps N]
//
// It trains until PATH exists (or N steps): every rank checks for the file in each step and the
// ranks agree by an all-reduce (max) inside the step, so all of them stop after the same committed
// step and exit 0. Output (stdout, flushed; T = CLOCK_REALTIME seconds, comparable with the
// script's time.time()):
//   ftb pid P rank R [replacement]      on entering the program (R: launch rank)
//   ftb resumed step S restart N t T     launch rank 0, after resume() (S: steps done; 0: none)
//   ftb committed step S rank R t T      every rank, after each committed step (S: steps done)
//   ftb aborted step S rank R t T        every rank, when the live ranks dropped step S
//   ftb healed bytes B rank R t T        the heal source: B = parameter + momentum bytes sent
//   ftb done step S rank R               every rank, at the end
#include <ATen/CPUGeneratorImpl.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/context.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/fault_tolerance.h>
#include <tandem/runtime/run_main.h>
#include <time.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

namespace {

using Model = torch::nn::SequentialImpl;
using Ddp = tandem::DistributedDataParallel<Model>;

double wall_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// What heal() sends of the tensors: every parameter and every SGD momentum buffer (the RNG
// state and the bucket plan are a few bytes more, not counted).
uint64_t state_bytes(torch::nn::Sequential& model, torch::optim::SGD& opt) {
  uint64_t bytes = 0;
  for (const auto& p : model->parameters()) {
    bytes += p.nbytes();
    const auto it = opt.state().find(p.unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    const auto& buffer = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
    if (buffer.defined()) bytes += buffer.nbytes();
  }
  return bytes;
}

int train(tandem::Context& ctx) {
  std::string ckpt_dir, stop_file;
  int64_t steps = 1000000000, every = 0, width = 4096, layers = 6, batch = 4;
  double lr = 1e-3;
  CLI::App app("ft_bench_worker: the training program of scripts/bench-ft");
  app.add_option("--ckpt", ckpt_dir, "checkpoint directory")->required();
  app.add_option("--stop-file", stop_file, "stop once this file exists")->required();
  app.add_option("--every", every, "checkpoint.every_n_steps (0: never save)");
  app.add_option("--steps", steps, "stop after this many steps at the latest");
  app.add_option("--width", width, "features of each Linear layer");
  app.add_option("--layers", layers, "Linear(width, width) layers");
  app.add_option("--batch", batch, "samples per rank per step");
  app.add_option("--lr", lr, "SGD learning rate (momentum 0.9)");
  app.parse(ctx.argc(), ctx.argv());

  const int launch_rank = ctx.rank();
  // First, so the script knows whom it may kill (a replacement prints it before it is admitted).
  std::printf("ftb pid %d rank %d%s\n", static_cast<int>(::getpid()), launch_rank,
              std::getenv("TANDEM_REPLACEMENT") != nullptr ? " replacement" : "");
  std::fflush(stdout);
  at::set_num_threads(1);  // 4 ranks share the cores

  tandem::FaultTolerantWorld ft(ctx.distributed(), ctx.config().comm, ctx.config().ft);
  torch::manual_seed(7);  // every rank, replacement included, builds the same model
  torch::nn::Sequential model;
  for (int64_t i = 0; i < layers; ++i) {
    if (i > 0) model->push_back(torch::nn::ReLU());
    model->push_back(torch::nn::Linear(width, width));
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));

  std::unique_ptr<Ddp> ddp;
  std::unique_ptr<tandem::CheckpointManager> ckpt;
  int64_t step = 0;
  // What agrees over the world, built again on each new one; a replacement is healed before the
  // wrapper exists (its constructor broadcasts rank 0's parameters).
  auto rebuild = [&] {
    ddp.reset();
    ckpt.reset();  // waits for its writer first
    tandem::CheckpointManagerOptions o;
    o.directory = ckpt_dir;
    o.every_n_steps = every;
    o.keep_last = 2;
    o.communicator = ft.communicator();
    ckpt = std::make_unique<tandem::CheckpointManager>(o);
    ckpt->add_module("model", *model);
    ckpt->add_optimizer("optim", opt);
    ckpt->add_rng("rng");
    if (!ft.heal_receivers().empty()) {
      ckpt->heal(ft.heal_source(), ft.heal_receivers());
      if (ft.rank() == ft.heal_source()) {
        std::printf("ftb healed bytes %llu rank %d t %.6f\n",
                    static_cast<unsigned long long>(state_bytes(model, opt)), launch_rank,
                    wall_seconds());
        std::fflush(stdout);
      }
    }
    ddp = std::make_unique<Ddp>(model.ptr(), ft.communicator(), ctx.config().ddp);
  };
  if (!ft.replacement()) {  // a replacement heals instead (from begin_step())
    rebuild();
    step = ckpt->resume();  // restart mode: the newest checkpoint; step FT: none written, 0
    if (launch_rank == 0) {
      std::printf("ftb resumed step %lld restart %d t %.6f\n", static_cast<long long>(step),
                  ctx.restart_count(), wall_seconds());
      std::fflush(stdout);
    }
  }

  bool stop = false;
  while (step < steps && !stop) {
    ft.begin_step(step, rebuild);
    opt.zero_grad();
    at::Tensor flag;
    auto work = [&] {  // every collective of the step
      auto gen = at::detail::createCPUGenerator(
          static_cast<uint64_t>(step) * 1000003ULL + static_cast<uint64_t>(ft.rank()));
      const at::Tensor x = at::randn({batch, width}, gen), y = at::randn({batch, width}, gen);
      torch::mse_loss((*ddp)(x), y).backward();
      // The stop decision is part of the step, so every rank of the epoch takes the same one.
      flag = at::full({1}, std::filesystem::exists(stop_file) ? 1.0F : 0.0F);
      ft.communicator()->allreduce(flag, tandem::ReduceOp::kMax)->wait();
    };
    if (ft.step(step, work) == tandem::StepOutcome::kAborted) {
      std::printf("ftb aborted step %lld rank %d t %.6f\n", static_cast<long long>(step),
                  launch_rank, wall_seconds());
      std::fflush(stdout);
      continue;  // the same step again, in the new world
    }
    opt.step();  // only committed steps change the state
    tandem::heartbeat();
    ++step;
    stop = flag.item<float>() > 0;
    std::printf("ftb committed step %lld rank %d t %.6f\n", static_cast<long long>(step),
                launch_rank, wall_seconds());
    std::fflush(stdout);
    ckpt->maybe_save(step);
  }
  ckpt->wait();
  std::printf("ftb done step %lld rank %d\n", static_cast<long long>(step), launch_rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return tandem::run_main(argc, argv, train); }
