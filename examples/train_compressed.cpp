// train_compressed: data-parallel training with gradient compression, next to plain averaging.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_compressed --codec powersgd
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_compressed --codec topk --param ratio=0.05
//
// Demonstrates tandem's gradient codecs: the tiny transformer LM of train_lm is trained twice from
// the same seed on the same batches, once with plain all-reduce averaging and once with --codec
// (fp16, bf16, powersgd, topk, sign, or any of them with wire=fp16|bf16; parameters as
// --param key=value, see docs/compression.md). Rank 0 prints, for both, the bytes each rank put on
// the wire per step and the loss, so the saving and its price in loss are side by side.
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <map>

#include "tiny_lm.h"

namespace {

struct Outcome {
  double loss = 0;
  double bytes_per_step = 0;
  double uncompressed_per_step = 0;
  double seconds = 0;
};

// Trains the LM for `steps` with `codec` and returns the final mean loss over ranks and traffic.
Outcome train(const std::shared_ptr<tandem::Communicator>& world,
              const std::shared_ptr<tandem::GradCodec>& codec, const torch::Tensor& data,
              int64_t steps, int64_t batch, uint64_t seed) {
  const tiny_lm::LmConfig lm;
  torch::manual_seed(seed);
  tiny_lm::TinyLm model(lm);
  tandem::DataParallelOptions options;
  options.codec = codec;
  tandem::DataParallel ddp(model, world, options);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  Outcome out;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    auto windows = tiny_lm::batch_windows(data, batch, lm.context, seed, step, world->rank());
    opt.zero_grad();
    auto loss = tiny_lm::lm_loss(ddp(tiny_lm::lm_inputs(windows)), windows);
    loss.backward();
    opt.step();
    out.bytes_per_step += static_cast<double>(codec->bytes_sent_last_step()) / steps;
    out.uncompressed_per_step += static_cast<double>(codec->uncompressed_bytes_last_step()) / steps;
    if (step + 1 == steps) {
      auto mean = loss.detach().clone();
      world->allreduce(mean, tandem::ReduceOp::kAvg)->wait();
      out.loss = mean.item<double>();
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("tandem example: gradient compression vs plain averaging (start with tandemrun)");
  std::string codec_name = "powersgd";
  std::vector<std::string> params;
  int64_t steps = 200, batch = 8;
  uint64_t seed = 1234;
  app.add_option("--codec", codec_name, "fp16, bf16, powersgd, topk or sign");
  app.add_option("--param", params, "codec parameter key=value (repeatable)");
  app.add_option("--steps", steps, "training steps of each run")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "seed of model init and data");
  CLI11_PARSE(app, argc, argv);

  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [&](int, char**) {
    at::set_num_threads(1);
    std::map<std::string, std::string> codec_params;
    for (const auto& p : params) {
      const auto eq = p.find('=');
      if (eq == std::string::npos)
        throw tandem::ConfigError("--param '" + p + "' is not key=value (e.g. --param rank=4)");
      codec_params[p.substr(0, eq)] = p.substr(eq + 1);
    }
    auto codec = tandem::make_codec(codec_name, codec_params);  // bad names fail before training
    auto dist = tandem::init();
    const auto data = tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 17, seed));

    const Outcome plain = train(dist.world, tandem::make_average_codec(), data, steps, batch, seed);
    const Outcome compressed = train(dist.world, codec, data, steps, batch, seed);
    if (dist.world->rank() == 0) {
      auto mib = [](double b) { return b / (1 << 20); };
      std::printf("%d ranks, %lld steps each, same seed and batches\n", dist.world->size(),
                  static_cast<long long>(steps));
      std::printf("%-22s %14s %12s %10s\n", "gradients", "MiB/step/rank", "final loss", "seconds");
      std::printf("%-22s %14.3f %12.4f %10.1f\n", "average (plain)", mib(plain.bytes_per_step),
                  plain.loss, plain.seconds);
      std::printf("%-22s %14.3f %12.4f %10.1f\n", codec->name().c_str(),
                  mib(compressed.bytes_per_step), compressed.loss, compressed.seconds);
      std::printf("%s sent %.1fx fewer bytes than plain averaging; loss %+.4f\n",
                  codec->name().c_str(), plain.bytes_per_step / compressed.bytes_per_step,
                  compressed.loss - plain.loss);
    }
    return 0;
  });
}
