// train_fault_tolerant: a training run that survives a killed worker.
//
//   tandemrun --standalone --nproc-per-node 2 --max-restarts 2 build/bin/train_fault_tolerant
//       --config examples/configs/train_fault_tolerant.yaml --crash-at-step 70   (one line)
//
// Demonstrates tandemrun's restarts and tandem::CheckpointManager: the tiny transformer LM of
// train_lm is trained with DistributedDataParallel; every checkpoint.every_n_steps steps the model,
// the AdamW state, the RNG and DistributedDataParallel's state are checkpointed into
// checkpoint.directory (atomic, checksummed, written in the background). With --crash-at-step S,
// rank 1 SIGKILLs itself at step S of the first attempt; tandemrun stops the other worker, starts
// both again, they resume from the newest valid checkpoint and finish. The final parameter checksum
// printed at the end is the same, to the bit, as that of a run without --crash-at-step (try it:
// same seed, same world size, same bits).
//
// Step-level fault tolerance (docs/fault_tolerance.md): under `tandemrun --ft` with
// --set ft.enabled=true, the same crash costs one step instead. Every step runs through
// tandem::FaultTolerantWorld; when rank 1 dies, rank 0 drops that step, goes on alone from the
// state it holds, and never opens a checkpoint. Its result is that of its failure schedule (two
// ranks up to the crash, one after), the same for every run with the same crash.
//
// With --ft-replace instead (and --set ft.replacement_wait_s=30), tandemrun starts a replacement
// for rank 1; rank 0 waits for it, heals it (model, AdamW state, RNG, the wrapper's bucket plan)
// over the communicator, and both finish at full size: the checksum is that of the run without
// --crash-at-step, and neither opened a checkpoint.
//
//   tandemrun --standalone --nproc-per-node 2 --ft build/bin/train_fault_tolerant
//       --config examples/configs/train_fault_tolerant.yaml --crash-at-step 70
//       --set ft.enabled=true                                                    (one line)
#include <signal.h>
#include <tandem/tandem.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "examples/cli.h"
#include "examples/tiny_lm.h"

namespace {

// A checksum of the parameters' bytes (XXH3-64), printed so two runs can be compared by eye.
uint64_t parameter_checksum(tiny_lm::TinyLm& model) {
  tandem::Xxh3Stream hash;
  for (const auto& p : model->parameters()) {
    const auto c = p.detach().to(at::kCPU).contiguous();  // hashed on the host
    hash.update(c.data_ptr(), c.nbytes());
  }
  return hash.digest();
}

int restart_count() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return v == nullptr ? 0 : std::atoi(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app("tandem example: fault-tolerant training (start with tandemrun --max-restarts)");
    int64_t crash_at = -1;
    bool fresh = false;
    app.add_option("--crash-at-step", crash_at, "rank 1 SIGKILLs itself at this step (first attempt)");
    app.add_flag("--fresh", fresh, "delete checkpoint.directory first (first attempt only)");
    if (const int status = examples::parse_flags(app, ctx.argc(), ctx.argv()); status >= 0)
      return status;
    at::set_num_threads(1);
    const auto& train = ctx.config().train;
    const int rank = ctx.rank();
    // checkpoint.* from the config; this example's defaults where the config leaves them unset.
    tandem::CheckpointManagerOptions options = ctx.config().checkpoint;
    if (options.directory.empty()) options.directory = "ckpt_fault_tolerant";
    if (options.every_n_steps == 0) options.every_n_steps = 20;
    const std::string dir = options.directory;
    // The world steps run in: the launch world, or after a rank died (tandemrun --ft), the ranks
    // left (and a replacement). The wrapper and the checkpoint manager agree over it, so both are
    // built on it again.
    tandem::FaultTolerantWorld ft(ctx.distributed(), ctx.config().comm, ctx.config().ft);
    if (!ft.replacement()) {  // a replacement's Context has no world: it joins through `ft`
      if (fresh && rank == 0 && restart_count() == 0) std::filesystem::remove_all(dir);
      ctx.world()->barrier()->wait();
    }

    const tiny_lm::LmConfig lm;
    const uint64_t seed = train.seed;
    const auto data = tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 16, seed)).to(ctx.device());
    torch::manual_seed(seed);
    tiny_lm::TinyLm model(lm);
    model->to(ctx.device());  // train.device
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(train.lr));
    // After a shrink the per-rank "ddp" state was saved by fewer ranks than a restarted group has:
    // such a restart keeps the replicated state (model, optimizer, RNG) and warns.
    if (ft.active()) options.reshard = tandem::ReshardPolicy::kLoadReplicatedOnly;
    using Ddp = tandem::DistributedDataParallel<tiny_lm::TinyLmImpl>;
    std::unique_ptr<Ddp> ddp;
    std::unique_ptr<tandem::CheckpointManager> ckpt;
    std::map<std::string, at::Tensor> plan;  // the bucket plan DistributedDataParallel learned
    // Builds the manager and the wrapper on ft's world; heals a replacement first (the wrapper's
    // constructor broadcasts rank 0's parameters, and rank 0 may be the replacement).
    auto connect = [&] {
      if (ddp) plan = ddp->state();
      ddp.reset();
      tandem::CheckpointManagerOptions o = options;
      o.communicator = ft.communicator();
      ckpt.reset();  // waits for its writer first
      ckpt = std::make_unique<tandem::CheckpointManager>(o);
      ckpt->add_module("model", *model);
      ckpt->add_optimizer("optim", opt);
      ckpt->add_rng("rng");
      ckpt->add_tensors(  // per rank
          "ddp", [&] { return ddp ? ddp->state() : plan; },
          [&](const std::map<std::string, at::Tensor>& s) {
            plan = s;
            if (ddp) ddp->load_state(s);
          },
          tandem::Sharding::kSharded);
      if (!ft.heal_receivers().empty()) ckpt->heal(ft.heal_source(), ft.heal_receivers());
      // A codec serves one communicator: a fresh one per world, given the state the last world
      // committed (an aborted step's part of it was dropped when the step aborted).
      tandem::DistributedDataParallelOptions dp = ctx.config().ddp;
      dp.codec = ctx.config().make_codec();
      ddp = std::make_unique<Ddp>(model, ft.communicator(), dp);
      if (!plan.empty()) ddp->load_state(plan);
    };
    int64_t first = 0;  // a replacement learns its first step from ft.begin_step() and heals
    if (!ft.replacement()) {
      connect();
      first = ckpt->resume();
    }
    if (rank == 0 && !ft.replacement()) {
      if (first > 0)
        std::printf("attempt %d: resumed from the checkpoint of step %lld in %s\n", restart_count(),
                    static_cast<long long>(first), dir.c_str());
      else
        std::printf("attempt %d: starting from scratch\n", restart_count());
    }
    double loss_value = 0;
    // Progress lines every metrics.log_every steps; under tandemrun --metrics-port, live metrics.
    tandem::ProgressLogger progress(ctx.config().metrics, train.steps, rank, ctx.world_size());
    if (ddp) progress.track_overlap(ddp->reducer());
    for (int64_t step = first; step < train.steps;) {
      if (ft.begin_step(step, connect)) {  // a rank was lost or a replacement joined
        progress.track_overlap(ddp->reducer());  // the new wrapper's
        if (ft.rank() == ft.heal_source() && !ft.heal_receivers().empty()) {
          std::printf("step %lld: healed %zu replacement(s) from rank %d\n",
                      static_cast<long long>(step), ft.heal_receivers().size(), ft.rank());
        }
      }
      if (step == crash_at && rank == 1 && restart_count() == 0 && ft.epoch() == 0) {
        std::printf("rank 1: simulating a crash at step %lld (SIGKILL)\n",
                    static_cast<long long>(step));
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      opt.zero_grad();
      at::Tensor loss;
      const tandem::StepOutcome outcome = ft.step(step, [&] {  // every collective of the step
        auto windows =
            tiny_lm::batch_windows(data, train.batch_size, lm.context, seed, step, ft.rank());
        loss = tiny_lm::lm_loss((*ddp)(tiny_lm::lm_inputs(windows)), windows);
        loss.backward();
      });
      if (outcome == tandem::StepOutcome::kAborted) {
        if (ft.rank() == 0) {
          std::printf("step %lld aborted: a rank died; going on with %d rank(s)\n",
                      static_cast<long long>(step), ft.world_size());
        }
        continue;  // the same step again, in the new world (begin_step() rebuilds)
      }
      opt.step();
      tandem::heartbeat();
      loss_value = loss.item<double>();
      ++step;
      ckpt->maybe_save(step);
      progress.step(step, loss_value, train.batch_size);
    }
    ckpt->wait();
    if (ft.rank() == 0) {
      // Resumed at the final step, this attempt ran no step: there is no loss to report.
      char loss[64] = "no step left to run, so no loss";
      if (first < train.steps) std::snprintf(loss, sizeof loss, "loss %.4f", loss_value);
      std::printf("finished %lld steps: %s, parameter checksum %016llx\n",
                  static_cast<long long>(train.steps), loss,
                  static_cast<unsigned long long>(parameter_checksum(model)));
    }
    return 0;
  });
}
