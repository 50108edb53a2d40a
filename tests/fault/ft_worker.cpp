// The training worker of the step-level fault-tolerance tests (tests/fault/ft_test.cpp), started
// by `tandemrun --ft` with --set ft.enabled=true. DistributedDataParallel over a tiny MLP, or with
// --set sharding.stage=1..3 ShardedDataParallel (hybrid with sharding.group_size), SGD with
// momentum, each step run through tandem::FaultTolerantWorld. The global batch of step s (12
// samples) depends only on s; a rank trains on its slice of it by its rank and size in the current
// epoch, so the result depends only on which world trained which step.
//
//   ft_worker --out FILE [--steps N] [--pause-ms MS]
//     trains (pausing MS after each step); the final epoch's rank 0 writes the parameters' raw
//     bytes to FILE.
//   ft_worker --out FILE --ckpt DIR --save-at K     (the reference's first part)
//     saves a checkpoint after step K and stops there.
//   ft_worker --out FILE --ckpt DIR [--every K]     (its second part, at the smaller world size)
//     resumes from DIR and trains to the end; with --every, checkpoints every K steps (also under
//     --ft, where the manager is rebuilt on each new world).
//
// Fault injection (environment): FT_KILL_RANKS=r[,r...] FT_KILL_STEP=k FT_KILL_AT=p makes those
// launch ranks SIGKILL themselves in step k, at p: forward (before it), backward (mid-backward,
// with gradient buckets in flight), vote (after backward, before the commit vote) or after (after
// the commit, before the optimizer step). Only the first attempt's first processes
// (TORCHELASTIC_RESTART_COUNT=0, no TANDEM_REPLACEMENT). FT_KILL_SIGNAL=STOP stops them instead (a
// hang, for tandemrun's heartbeat timeout). FT_HEAL_KILL=source|receiver: the first heal's source,
// or its first-incarnation receiver, SIGKILLs itself as the heal begins. FT_REPLACEMENT_DELAY_MS:
// a replacement waits this long before asking to join.
// Under tandemrun --ft-replace a replacement joins, heals (model, optimizer) from a live peer and
// trains on from the group's step; "ft healed step S receivers R" is printed by the source.
// Output: "ft start pid P rank R", "ft aborted step S epoch E members M", "ft done pid P rank R
// epoch E since S aborted A members M" (since: the first step the final epoch trained).
#include <ATen/CPUGeneratorImpl.h>
#include <signal.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/context.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/fault_tolerance.h>
#include <tandem/runtime/run_main.h>
#include <tandem/runtime/sharded_data_parallel.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

namespace {

using Model = torch::nn::SequentialImpl;
using Ddp = tandem::DistributedDataParallel<Model>;
using Sdp = tandem::ShardedDataParallel<Model>;

std::string env_or(const char* key, const char* fallback) {
  const char* v = std::getenv(key);
  return v != nullptr ? v : fallback;
}

bool kills_here(int launch_rank, int64_t step, const std::string& point) {
  if (env_or("FT_KILL_AT", "") != point || std::stoll(env_or("FT_KILL_STEP", "-1")) != step ||
      env_or("TORCHELASTIC_RESTART_COUNT", "0") != "0" || env_or("TANDEM_REPLACEMENT", "0") != "0")
    return false;
  std::stringstream ranks(env_or("FT_KILL_RANKS", ""));
  std::string r;
  while (std::getline(ranks, r, ',')) {
    if (!r.empty() && std::stoi(r) == launch_rank) return true;
  }
  return false;
}

void kill_self(int launch_rank, int64_t step, const std::string& point) {
  std::printf("ft kill rank %d step %lld at %s\n", launch_rank, static_cast<long long>(step),
              point.c_str());
  std::fflush(stdout);
  ::raise(env_or("FT_KILL_SIGNAL", "KILL") == "STOP" ? SIGSTOP : SIGKILL);
}

void maybe_kill(int launch_rank, int64_t step, const std::string& point) {
  if (kills_here(launch_rank, step, point)) kill_self(launch_rank, step, point);
}

std::string members_text(const std::vector<int>& members) {
  std::string s;
  for (int m : members) s += (s.empty() ? "" : ",") + std::to_string(m);
  return s;
}

int train(tandem::Context& ctx) {
  std::string out, ckpt_dir;
  int64_t steps = 6, save_at = -1, every = 0;
  CLI::App app("ft_worker");
  app.add_option("--out", out)->required();
  app.add_option("--steps", steps);
  app.add_option("--ckpt", ckpt_dir);
  app.add_option("--save-at", save_at);
  app.add_option("--every", every);
  int pause_ms = 0;  // per step: a replacement (seconds to start) finds the group still training
  app.add_option("--pause-ms", pause_ms);
  app.parse(ctx.argc(), ctx.argv());

  // A replacement that starts late: the others went on without it meanwhile.
  if (env_or("TANDEM_REPLACEMENT", "0") != "0")
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(env_or("FT_REPLACEMENT_DELAY_MS", "0"))));
  tandem::FaultTolerantWorld ft(ctx.distributed(), ctx.config().comm, ctx.config().ft);
  const int launch_rank = ctx.rank();
  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(10, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  tandem::DistributedDataParallelOptions dp_options;
  dp_options.bucket_cap_mb = 0.0005;  // several buckets: some are in flight mid-backward
  const tandem::ShardingOptions& sharding = ctx.config().sharding;
  const bool sharded = sharding.stage > 0;
  // Ranks one shard group apart hold the same slices of sharded state (0: the launch world).
  const int shard_group = sharded ? sharding.group_size : 1;
  std::unique_ptr<Ddp> ddp;
  std::unique_ptr<Sdp> sdp;
  const auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9);
  std::unique_ptr<torch::optim::SGD> opt;
  if (!sharded) opt = std::make_unique<torch::optim::SGD>(model->parameters(), sgd);

  // The manager agrees over its communicator: after an abort it is built again on the new world.
  // Without --ckpt it only heals (nothing is written to its directory).
  std::unique_ptr<tandem::CheckpointManager> ckpt;
  auto make_ckpt = [&] {
    tandem::CheckpointManagerOptions o;
    o.directory = ckpt_dir.empty() ? out + ".heal-only" : ckpt_dir;
    o.async = false;
    o.every_n_steps = every;
    o.communicator = ft.communicator();
    ckpt = std::make_unique<tandem::CheckpointManager>(o);
    if (sharded) {
      sdp->register_checkpoint(*ckpt, "model");
      sdp->register_optimizer(*ckpt, "optim", *opt);
    } else {
      ckpt->add_module("model", *model);
      ckpt->add_optimizer("optim", *opt);
    }
  };
  int64_t step = 0;
  // What agrees over the world, built again on each new one; a replacement is healed first (the
  // wrapper's constructor broadcasts rank 0's parameters, and rank 0 may be the replacement).
  // Sharded: the survivors carry their shards onto the new world; a replacement builds its wrapper
  // without the broadcast and heals from the rank holding its slices in another replica group.
  auto rebuild = [&] {
    const std::vector<int> sources = ft.heal_sources(shard_group);
    if (!sharded) {
      ddp.reset();
    } else if (sdp) {
      sdp->reconnect(ft.communicator());
    } else {
      sdp = std::make_unique<Sdp>(model.ptr(), ft.communicator(), sharding, dp_options,
                                  ft.replacement() ? tandem::ShardedStart::kLoadedAfter
                                                   : tandem::ShardedStart::kBroadcast);
      opt = std::make_unique<torch::optim::SGD>(sdp->parameters(), sgd);
    }
    make_ckpt();
    if (!ft.heal_receivers().empty()) {
      const auto& r = ft.heal_receivers();
      const auto sent = std::count(sources.begin(), sources.end(), ft.rank());
      const bool receiver = std::find(r.begin(), r.end(), ft.rank()) != r.end();
      const std::string kill = env_or("FT_HEAL_KILL", "");
      if ((kill == "source" && sent > 0 && env_or("TANDEM_REPLACEMENT", "0") == "0" && ft.epoch() == 1) ||
          (kill == "receiver" && receiver && env_or("TANDEM_REPLACEMENT", "0") == "1"))
        kill_self(launch_rank, step, "heal");
      ckpt->heal(sources, r);
      if (sent > 0) {
        std::printf("ft healed step %lld receivers %lld epoch %lld\n", static_cast<long long>(step),
                    static_cast<long long>(sent), static_cast<long long>(ft.epoch()));
        std::fflush(stdout);
      }
    }
    if (!sharded) ddp = std::make_unique<Ddp>(model.ptr(), ft.communicator(), dp_options);
  };
  if (!ft.replacement()) {
    rebuild();
    if (!ckpt_dir.empty() && save_at < 0) step = ckpt->resume();
  }
  std::printf("ft start pid %d rank %d%s\n", static_cast<int>(::getpid()), launch_rank,
              ft.replacement() ? " replacement" : "");
  std::fflush(stdout);

  int64_t since = step;
  while (step < steps) {
    if (ft.begin_step(step, rebuild)) since = step;
    opt->zero_grad();
    auto work = [&] {
      maybe_kill(launch_rank, step, "forward");
      auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
      const at::Tensor x_all = at::randn({12, 10}, gen), y_all = at::randn({12, 3}, gen);
      const int64_t per = 12 / ft.world_size(), first = per * ft.rank();
      const int64_t count = ft.rank() + 1 == ft.world_size() ? 12 - first : per;
      const at::Tensor x = x_all.narrow(0, first, count), y = y_all.narrow(0, first, count);
      torch::mse_loss(sharded ? (*sdp)(x) : (*ddp)(x), y).backward();
      maybe_kill(launch_rank, step, "vote");
    };
    // Mid-backward: a hook on the first layer's weight gradient runs after the last layer's
    // buckets were launched.
    auto& weight = model[0]->as<torch::nn::Linear>()->weight;
    const bool kill_in_backward = kills_here(launch_rank, step, "backward");
    unsigned handle = 0;
    if (kill_in_backward)
      handle = weight.register_hook([&](const at::Tensor&) { maybe_kill(launch_rank, step, "backward"); });
    const tandem::StepOutcome outcome = ft.step(step, work);
    if (kill_in_backward) weight.remove_hook(handle);
    if (outcome == tandem::StepOutcome::kAborted) {
      std::printf("ft aborted step %lld epoch %lld members %s\n", static_cast<long long>(step),
                  static_cast<long long>(ft.epoch()), members_text(ft.members()).c_str());
      std::fflush(stdout);
      continue;  // begin_step() rebuilds on the new world
    }
    maybe_kill(launch_rank, step, "after");
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    opt->step();
    tandem::heartbeat();
    ++step;
    if (step == save_at) {
      ckpt->save(step);
      ckpt->wait();
      break;
    }
    if (!ckpt_dir.empty()) ckpt->maybe_save(step);
  }
  if (sharded && save_at < 0) sdp->gather_parameters();  // collective: the full parameters
  if (ft.rank() == 0 && save_at < 0) {
    std::ofstream file(out, std::ios::binary | std::ios::trunc);
    for (const auto& p : model->parameters()) {
      const auto c = p.detach().contiguous();
      file.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    }
    if (!file) throw std::runtime_error("cannot write " + out);
  }
  std::printf("ft done pid %d rank %d epoch %lld since %lld aborted %lld members %s\n",
              static_cast<int>(::getpid()), launch_rank, static_cast<long long>(ft.epoch()),
              static_cast<long long>(since), static_cast<long long>(ft.aborted_steps()),
              members_text(ft.members()).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return tandem::run_main(argc, argv, train); }
