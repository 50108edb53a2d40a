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
    options.communicator = ctx.world();
    const std::string dir = options.directory;
    if (fresh && rank == 0 && restart_count() == 0) std::filesystem::remove_all(dir);
    ctx.world()->barrier()->wait();

    const tiny_lm::LmConfig lm;
    const uint64_t seed = train.seed;
    const auto data = tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 16, seed)).to(ctx.device());
    torch::manual_seed(seed);
    tiny_lm::TinyLm model(lm);
    model->to(ctx.device());  // train.device
    tandem::DistributedDataParallel ddp(model, ctx.world(), ctx.config().ddp);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(train.lr));
    tandem::CheckpointManager ckpt(options);
    ckpt.add_module("model", *model);
    ckpt.add_optimizer("optim", opt);
    ckpt.add_rng("rng");
    ckpt.add_tensors(  // the bucket plan DistributedDataParallel learned, per rank
        "ddp", [&] { return ddp.state(); },
        [&](const std::map<std::string, at::Tensor>& s) { ddp.load_state(s); },
        tandem::Sharding::kSharded);

    const int64_t first = ckpt.resume();
    if (rank == 0) {
      if (first > 0)
        std::printf("attempt %d: resumed from the checkpoint of step %lld in %s\n", restart_count(),
                    static_cast<long long>(first), dir.c_str());
      else
        std::printf("attempt %d: starting from scratch\n", restart_count());
    }
    double loss_value = 0;
    // Progress lines every metrics.log_every steps; under tandemrun --metrics-port, live metrics.
    tandem::ProgressLogger progress(ctx.config().metrics, train.steps, rank, ctx.world_size());
    progress.track_overlap(ddp.reducer());
    for (int64_t step = first; step < train.steps; ++step) {
      if (step == crash_at && rank == 1 && restart_count() == 0) {
        std::printf("rank 1: simulating a crash at step %lld (SIGKILL)\n",
                    static_cast<long long>(step));
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      auto windows = tiny_lm::batch_windows(data, train.batch_size, lm.context, seed, step, rank);
      opt.zero_grad();
      auto loss = tiny_lm::lm_loss(ddp(tiny_lm::lm_inputs(windows)), windows);
      loss.backward();
      opt.step();
      tandem::heartbeat();
      loss_value = loss.item<double>();
      ckpt.maybe_save(step + 1);
      progress.step(step + 1, loss_value, train.batch_size);
    }
    ckpt.wait();
    if (rank == 0) {
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
