// train_lm: data-parallel training of a small transformer language model on a text file.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_lm
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_lm --text book.txt --steps 1000
//
// Demonstrates tandem::DataParallel on a transformer: gradients are bucketed and all-reduced
// while backward runs; rank 0 prints progress, then a greedy sample of what the model learned,
// and saves the trained model (torch::save) to --save. Byte-level tokens, so any text file works;
// without --text a synthetic text from a small grammar is used. Same seed and world size: same bits.
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "tiny_lm.h"

int main(int argc, char** argv) {
  CLI::App app("tandem example: data-parallel transformer language model (start with tandemrun)");
  std::string text_path, save = "lm_model.pt";
  int64_t steps = 300, batch = 16, log_every = 20;
  double lr = 3e-3;
  uint64_t seed = 1234;
  tiny_lm::LmConfig lm;
  app.add_option("--text", text_path, "UTF-8/ASCII text file to learn (default: synthetic text)");
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--context", lm.context, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--dim", lm.dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--layers", lm.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--log-every", log_every, "progress line every N steps")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "seed of model init and data");
  app.add_option("--save", save, "where rank 0 saves the trained model");
  CLI11_PARSE(app, argc, argv);

  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [&](int, char**) {
    at::set_num_threads(1);
    auto dist = tandem::init();
    const int rank = dist.world->rank();
    const int world = dist.world->size();

    const std::string text = text_path.empty() ? tiny_lm::synthetic_text(1 << 18, seed)
                                               : tiny_lm::read_text(text_path, 4 * lm.context);
    const auto data = tiny_lm::text_tensor(text);

    torch::manual_seed(seed);  // same initial weights everywhere (DataParallel also checks)
    tiny_lm::TinyLm model(lm);
    tandem::DataParallel ddp(model, dist.world);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
    if (rank == 0) {
      int64_t params = 0;
      for (const auto& p : model->parameters()) params += p.numel();
      std::printf("train_lm: %lld parameters, %d ranks x %lld sequences of %lld bytes, text %zu bytes%s\n",
                  static_cast<long long>(params), world, static_cast<long long>(batch),
                  static_cast<long long>(lm.context), text.size(),
                  text_path.empty() ? " (synthetic)" : "");
    }

    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto window = start;
    double first_loss = 0, loss_value = 0;
    for (int64_t step = 0; step < steps; ++step) {
      auto windows = tiny_lm::batch_windows(data, batch, lm.context, seed, step, rank);
      opt.zero_grad();
      auto loss = tiny_lm::lm_loss(ddp(tiny_lm::lm_inputs(windows)), windows);
      loss.backward();
      opt.step();
      tandem::heartbeat();
      auto reported = loss.detach().clone();  // mean over ranks, for the log only
      dist.world->allreduce(reported, tandem::ReduceOp::kAvg)->wait();
      loss_value = reported.item<double>();
      if (step == 0) first_loss = loss_value;
      if (rank == 0 && ((step + 1) % log_every == 0 || step + 1 == steps)) {
        const auto now = Clock::now();
        const double seconds = std::chrono::duration<double>(now - window).count();
        const int64_t n = (step + 1) % log_every == 0 ? log_every : (step + 1) % log_every;
        std::printf("step %5lld  loss %.4f  %7.0f tokens/s\n", static_cast<long long>(step + 1),
                    loss_value, static_cast<double>(n * batch * world * lm.context) / seconds);
        std::fflush(stdout);
        window = now;
      }
    }
    if (rank == 0) {
      const double total = std::chrono::duration<double>(Clock::now() - start).count();
      std::printf("trained %lld steps in %.1f s: loss %.3f -> %.3f (uniform guess: %.3f)\n",
                  static_cast<long long>(steps), total, first_loss, loss_value, std::log(256.0));
      model->eval();
      std::printf("sample: \"%s\"\n", tiny_lm::generate(model, "the cat ", 60).c_str());
      torch::save(model, save);
      std::printf("saved the model to %s\n", save.c_str());
    }
    return 0;
  });
}
