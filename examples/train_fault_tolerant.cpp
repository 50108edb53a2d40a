// train_fault_tolerant: a training run that survives a killed worker.
//
//   tandemrun --standalone --nproc-per-node 2 --max-restarts 2 build/bin/train_fault_tolerant
//       --crash-at-step 70        (one command line)
//
// Demonstrates tandemrun's restarts and tandem::CheckpointManager: the tiny transformer LM of
// train_lm is trained with DataParallel; every --every steps the model, the AdamW state, the RNG
// and DataParallel's state are checkpointed (atomic, checksummed, written in the background).
// With --crash-at-step S, rank 1 SIGKILLs itself at step S of the first attempt; tandemrun stops
// the other worker, starts both again, they resume from the newest valid checkpoint and finish.
// The final parameter checksum printed at the end is the same, to the bit, as that of a run
// without --crash-at-step (try it: same seed, same world size, same bits).
#include <signal.h>
#include <tandem/tandem.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "tiny_lm.h"

namespace {

// A checksum of the parameters' bytes, printed so two runs can be compared by eye.
uint64_t parameter_checksum(tiny_lm::TinyLm& model) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (const auto& p : model->parameters()) {
    auto c = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (int64_t i = 0; i < c.numel() * static_cast<int64_t>(c.element_size()); ++i)
      h = (h ^ bytes[i]) * 1099511628211ULL;
  }
  return h;
}

int restart_count() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return v == nullptr ? 0 : std::atoi(v);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("tandem example: fault-tolerant training (start with tandemrun --max-restarts)");
  std::string dir = "ckpt_fault_tolerant";
  int64_t steps = 150, batch = 8, every = 20, crash_at = -1;
  uint64_t seed = 1234;
  bool fresh = false;
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--every", every, "checkpoint every N steps")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", dir, "where checkpoints go");
  app.add_option("--crash-at-step", crash_at, "rank 1 SIGKILLs itself at this step (first attempt)");
  app.add_option("--seed", seed, "seed of model init and data");
  app.add_flag("--fresh", fresh, "ignore existing checkpoints (delete --checkpoint-dir first)");
  CLI11_PARSE(app, argc, argv);

  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [&](int, char**) {
    at::set_num_threads(1);
    auto dist = tandem::init();
    const int rank = dist.world->rank();
    if (fresh && rank == 0 && restart_count() == 0) std::filesystem::remove_all(dir);
    dist.world->barrier()->wait();

    const tiny_lm::LmConfig lm;
    const auto data = tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 16, seed));
    torch::manual_seed(seed);
    tiny_lm::TinyLm model(lm);
    tandem::DataParallel ddp(model, dist.world);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));

    tandem::CheckpointManagerOptions options;
    options.directory = dir;
    options.every_n_steps = every;
    options.keep_last = 2;
    options.communicator = dist.world;
    tandem::CheckpointManager ckpt(options);
    ckpt.add_module("model", *model);
    ckpt.add_optimizer("optim", opt);
    ckpt.add_rng("rng");
    ckpt.add_tensors(  // the bucket plan DataParallel learned, per rank
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
    for (int64_t step = first; step < steps; ++step) {
      if (step == crash_at && rank == 1 && restart_count() == 0) {
        std::printf("rank 1: simulating a crash at step %lld (SIGKILL)\n",
                    static_cast<long long>(step));
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      auto windows = tiny_lm::batch_windows(data, batch, lm.context, seed, step, rank);
      opt.zero_grad();
      auto loss = tiny_lm::lm_loss(ddp(tiny_lm::lm_inputs(windows)), windows);
      loss.backward();
      opt.step();
      tandem::heartbeat();
      loss_value = loss.item<double>();
      if (rank == 0 && (step + 1) % 25 == 0)
        std::printf("step %4lld  loss %.4f\n", static_cast<long long>(step + 1), loss_value);
      ckpt.maybe_save(step + 1);
    }
    ckpt.wait();
    if (rank == 0)
      std::printf("finished %lld steps: loss %.4f, parameter checksum %016llx\n",
                  static_cast<long long>(steps), loss_value,
                  static_cast<unsigned long long>(parameter_checksum(model)));
    return 0;
  });
}
