// train_compressed: data-parallel training with gradient compression, next to plain averaging.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_compressed
//       --config examples/configs/train_compressed.yaml            (one command line)
//   ... build/bin/train_compressed --set compression.codec=topk --set compression.topk.ratio=0.05
//
// Demonstrates tandem's gradient codecs: the tiny transformer LM of train_lm is trained twice from
// the same seed on the same batches, once with plain all-reduce averaging and once with the codec
// of the config's compression section (fp16, bf16, auto, powersgd, topk, sign, and compression.wire;
// see docs/compression.md). train.steps, batch_size, lr and seed come from the config too. Rank 0 prints, for both, the bytes each rank put on
// the wire per step and the loss, so the saving and its price in loss are side by side.
#include <tandem/tandem.h>

#include <chrono>
#include <cstdio>

#include "examples/tiny_lm.h"

namespace {

struct Outcome {
  double loss = 0;
  double bytes_per_step = 0;
  double uncompressed_per_step = 0;
  double seconds = 0;
};

// Trains the LM for `steps` with `codec` and returns the final mean loss over ranks and traffic.
Outcome train_once(const std::shared_ptr<tandem::Communicator>& world,
                   const std::shared_ptr<tandem::GradCodec>& codec, const torch::Tensor& data,
                   const tandem::TrainOptions& train, const c10::Device& device) {
  const int64_t steps = train.steps, batch = train.batch_size;
  const uint64_t seed = train.seed;
  const tiny_lm::LmConfig lm;
  torch::manual_seed(seed);
  tiny_lm::TinyLm model(lm);
  model->to(device);
  tandem::DistributedDataParallelOptions options;
  options.codec = codec;
  options.device = device;
  tandem::DistributedDataParallel ddp(model, world, options);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(train.lr));
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
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    at::set_num_threads(1);
    const auto& config = ctx.config();
    auto codec = config.make_codec();  // from compression.*; nullptr for plain averaging
    if (!codec) {
      if (ctx.rank() == 0)
        std::printf("compression.codec is 'average': nothing to compare; try --config "
                    "examples/configs/train_compressed.yaml or --set compression.codec=powersgd\n");
      return 0;
    }
    const auto& train = config.train;
    const auto data =
        tiny_lm::text_tensor(tiny_lm::synthetic_text(1 << 17, train.seed)).to(ctx.device());
    const Outcome plain =
        train_once(ctx.world(), tandem::make_average_codec(), data, train, ctx.device());
    const Outcome compressed = train_once(ctx.world(), codec, data, train, ctx.device());
    if (ctx.rank() == 0) {
      auto mib = [](double b) { return b / (1 << 20); };
      std::printf("%d ranks, %lld steps each, same seed and batches\n", ctx.world_size(),
                  static_cast<long long>(train.steps));
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
