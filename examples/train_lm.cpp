// train_lm: data-parallel training of a small transformer language model on a text file.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_lm --config
//   examples/configs/train_lm.yaml
//   ... build/bin/train_lm --set train.data=book.txt --set train.steps=1000 --set
//   trace.enabled=true
//
// Demonstrates tandem::DistributedDataParallel on a transformer, driven by tandem's config:
// everything under train.*, ddp.*, compression.*, precision.*, metrics.*, trace.* comes from YAML /
// TANDEM_* / --set (print it all with --print-config, every key with --help-config). Mixed
// precision: --set precision.autocast=bf16 --set precision.param_dtype=bf16 trains bf16 parameters
// under bf16 autocast while AdamW steps fp32 masters (examples/configs/train_lm_bf16.yaml). Gradients are bucketed
// and all-reduced while backward runs; rank 0 prints a progress line every metrics.log_every steps
// (loss, samples/s, ETA, peak memory, hidden communication), then a greedy sample of what the model learned, and
// saves the trained model (torch::save) to --save. Byte-level tokens, so any text file works;
// without train.data a synthetic text from a small grammar is used. The model's shape comes from
// the program's own flags (--context, --dim, --layers, --heads). Same seed and world size: same
// bits.
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "examples/cli.h"
#include "examples/tiny_lm.h"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app("tandem example: data-parallel transformer language model");
    tiny_lm::LmConfig lm;
    std::string save = "lm_model.pt";
    app.add_option("--context", lm.context, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--dim", lm.dim, "model width")->check(CLI::PositiveNumber);
    app.add_option("--heads", lm.heads, "attention heads (must divide --dim)")
        ->check(CLI::PositiveNumber);
    app.add_option("--layers", lm.layers, "transformer blocks")->check(CLI::PositiveNumber);
    app.add_option("--save", save, "where rank 0 saves the trained model");
    if (const int status = examples::parse_flags(app, ctx.argc(), ctx.argv()); status >= 0)
      return status;
    if (lm.dim % lm.heads != 0)
      throw tandem::ConfigError("--heads " + std::to_string(lm.heads) + " does not divide --dim " +
                                std::to_string(lm.dim));
    at::set_num_threads(1);
    const auto& train = ctx.config().train;
    const int rank = ctx.rank();
    const int world = ctx.world_size();

    const std::string text = train.data.empty() ? tiny_lm::synthetic_text(1 << 18, train.seed)
                                                : tiny_lm::read_text(train.data, 4 * lm.context);
    const auto data = tiny_lm::text_tensor(text).to(ctx.device());  // train.device

    torch::manual_seed(
        train.seed);  // same initial weights everywhere (DistributedDataParallel checks)
    tiny_lm::TinyLm model(lm);
    model->to(ctx.device());
    tandem::DistributedDataParallel ddp(model, ctx.world(), ctx.config().ddp);
    // The fp32 masters under mixed precision (precision.param_dtype), else the parameters.
    torch::optim::AdamW opt(ddp.parameters(),
                            torch::optim::AdamWOptions(train.lr).weight_decay(train.weight_decay));
    const auto& precision = ctx.config().precision;
    tandem::GradScaler scaler(ctx.config().scaler_options(), ctx.world());
    if (rank == 0) {
      int64_t params = 0;
      for (const auto& p : model->parameters()) params += p.numel();
      std::printf("train_lm: %lld parameters on %s, %d ranks x %lld sequences of %lld bytes, "
                  "gradients: %s, parameters %s, autocast %s, text %zu bytes%s\n",
                  static_cast<long long>(params), ctx.device().str().c_str(), world,
                  static_cast<long long>(train.batch_size),
                  static_cast<long long>(lm.context), ctx.config().compression.codec.c_str(),
                  c10::toString(ctx.config().ddp.mixed_precision.param_dtype),
                  precision.autocast == at::kFloat ? "off" : c10::toString(precision.autocast),
                  text.size(), train.data.empty() ? " (synthetic)" : "");
    }

    tandem::ProgressLogger progress(ctx.config().metrics, train.steps, rank, world);
    progress.track_overlap(ddp.reducer());
    double first_loss = 0, loss_value = 0;
    for (int64_t step = 0; step < train.steps; ++step) {
      auto windows = tiny_lm::batch_windows(data, train.batch_size, lm.context, train.seed, step, rank);
      opt.zero_grad();
      torch::Tensor loss;
      {
        tandem::AutocastGuard autocast(ctx.device().type(), precision.autocast,
                                       precision.autocast != at::kFloat);
        loss = tiny_lm::lm_loss(ddp(tiny_lm::lm_inputs(windows)), windows);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);  // skips the step if a gradient overflowed on any rank (fp16)
      scaler.update();
      tandem::heartbeat();
      loss_value = loss.item<double>();  // this rank's loss (the progress line shows rank 0's)
      if (step == 0) first_loss = loss_value;
      progress.step(step + 1, loss_value, train.batch_size);
    }
    if (rank == 0) {
      std::printf("trained %lld steps: loss %.3f -> %.3f (a uniform guess scores %.3f)\n",
                  static_cast<long long>(train.steps), first_loss, loss_value, std::log(256.0));
      ddp.gather_parameters();  // mixed precision: the last step's masters into the model
      model->eval();
      std::printf("sample: \"%s\"\n", tiny_lm::generate(model, "the cat ", 60).c_str());
      torch::save(model, save);
      std::printf("saved the model to %s\n", save.c_str());
    }
    return 0;
  });
}
