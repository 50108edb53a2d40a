// train_sharded: a transformer language model whose replicated training state does not fit in
// memory, trained by sharding that state across the ranks (ShardedDataParallel, ZeRO stage 3).
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_sharded
//       --config examples/configs/train_sharded.yaml                     (one command line)
//   ... --set sharding.stage=0                            nothing sharded: out of memory
//   ... --set sharding.stage=0 --set allocator.limit_bytes=0     the same without the cap
//
// The config installs tandem's host allocator with a cap (allocator.install, allocator.limit_bytes),
// which stands in for a device's memory. Replicated, the model's fp32 AdamW training state takes
// 16 bytes per parameter on every rank (parameters 4, gradients 4, Adam's two moments 8): more
// than the cap, so sharding.stage 0 (nothing sharded, as DistributedDataParallel) fails with
// tandem's out-of-memory message, which says to shard. At sharding.stage 3 each rank holds 16/N bytes per parameter plus
// the transformer blocks being computed (each block is a ShardedUnit, gathered just before it runs
// and freed after), and it trains, to the loss DistributedDataParallel reaches without the cap.
// Rank 0 prints the memory arithmetic, a progress line every metrics.log_every steps (with the
// allocator's peak), and the final loss. Every checkpoint.every_n_steps steps the sharded model,
// the AdamW state and the RNG go into checkpoint.directory (each rank writes its shards), and a
// restarted run resumes from the newest one, at any world size. At the end the whole model is
// written as one safetensors file for inference (--export), one block in memory at a time.
// Byte-level LM on the synthetic text of examples/tiny_lm.h (or train.data); the model's shape
// comes from --dim, --layers, --heads, --context.
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "examples/cli.h"
#include "examples/tiny_lm.h"

namespace {

using Block = tandem::ShardedUnit<tiny_lm::BlockImpl>;

// tiny_lm's model with every block a ShardedUnit (outside stage 3 a plain block). The embeddings,
// final norm and head belong to no unit: stage 3 gathers them for the whole step.
struct ShardedLmImpl : torch::nn::Module {
  explicit ShardedLmImpl(const tiny_lm::LmConfig& c)
      : tokens(register_module("tokens", torch::nn::Embedding(c.vocab, c.dim))),
        positions(register_module("positions", torch::nn::Embedding(c.context, c.dim))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        head(register_module("head", torch::nn::Linear(c.dim, c.vocab))) {
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       Block(tiny_lm::Block(c.dim, c.heads))));
    }
  }

  // ids: [batch, t] int64. Returns logits [batch, t, vocab].
  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = tokens(ids) + positions(torch::arange(ids.size(1), ids.options()));
    for (auto& block : blocks) x = block(x);
    return head(ln(x));
  }

  torch::nn::Embedding tokens, positions;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
  std::vector<Block> blocks;
};
TORCH_MODULE(ShardedLm);

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// Rank 0 prints what the training state costs replicated and at this stage.
void print_memory_arithmetic(const ShardedLm& model, const tiny_lm::LmConfig& lm,
                             const tandem::Config& config, int world) {
  const int64_t cap = config.allocator.install
                          ? static_cast<int64_t>(config.allocator.stack.limit_bytes) : 0;
  const std::string cap_text =
      cap > 0 ? std::to_string(static_cast<long long>(mib(static_cast<double>(cap)))) + " MiB"
              : "none";
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  const int stage = config.sharding.stage;
  const double per_param[] = {16.0, 8.0 + 8.0 / world, 4.0 + 12.0 / world, 16.0 / world};
  std::printf("train_sharded: %.1f M parameters in %lld blocks; replicated fp32 AdamW state "
              "16 bytes/parameter = %.0f MiB per rank; sharding.stage=%d on %d ranks: %.1f "
              "bytes/parameter = %.0f MiB per rank (+ the blocks being computed); memory cap "
              "(allocator.limit_bytes) %s\n",
              params / 1e6, static_cast<long long>(lm.layers), mib(16.0 * params), stage, world,
              per_param[stage], mib(per_param[stage] * params), cap_text.c_str());
}

// Trains, checkpointing and resuming; exports the whole model to `export_path` (unless empty).
int train(tandem::Context& ctx, const tiny_lm::LmConfig& lm, const std::string& export_path) {
  at::set_num_threads(1);
  const tandem::Config& config = ctx.config();
  const auto& train = config.train;
  const int rank = ctx.rank();
  const std::string text = train.data.empty() ? tiny_lm::synthetic_text(1 << 18, train.seed)
                                              : tiny_lm::read_text(train.data, 4 * lm.context);
  const auto data = tiny_lm::text_tensor(text).to(ctx.device());  // train.device
  torch::manual_seed(train.seed);  // the same initial weights on every rank
  ShardedLm model(lm);
  model->to(ctx.device());
  if (rank == 0) print_memory_arithmetic(model, lm, config, ctx.world_size());

  // sharding.stage 0 shards nothing (each rank holds everything, as DistributedDataParallel);
  // 1-3 shard the optimizer state, then the gradients, then the parameters. The same loop.
  // The Context's mesh: the shard groups it makes are the ones every other component shares.
  tandem::ShardedDataParallel sdp(model, ctx.mesh(), config.sharding, config.ddp);
  torch::optim::AdamW opt(sdp.parameters(),
                          torch::optim::AdamWOptions(train.lr).weight_decay(train.weight_decay));

  // checkpoint.* from the config; this example's defaults where the config leaves them unset.
  tandem::CheckpointManagerOptions checkpoints = config.checkpoint;
  if (checkpoints.directory.empty()) checkpoints.directory = "ckpt_sharded";
  if (checkpoints.every_n_steps == 0) checkpoints.every_n_steps = 20;
  checkpoints.communicator = ctx.world();
  tandem::CheckpointManager ckpt(checkpoints);
  sdp.register_checkpoint(ckpt, "model");
  sdp.register_optimizer(ckpt, "optim", opt);
  ckpt.add_rng("rng");
  const int64_t first = ckpt.resume();
  if (rank == 0 && first > 0) {
    std::printf("resumed from the checkpoint of step %lld in %s\n", static_cast<long long>(first),
                checkpoints.directory.c_str());
  }

  tandem::ProgressLogger progress(config.metrics, train.steps, rank, ctx.world_size());
  double first_loss = 0, loss_value = 0;
  for (int64_t step = first; step < train.steps; ++step) {
    auto windows = tiny_lm::batch_windows(data, train.batch_size, lm.context, train.seed, step, rank);
    opt.zero_grad();
    auto loss = tiny_lm::lm_loss(sdp(tiny_lm::lm_inputs(windows)), windows);
    loss.backward();
    opt.step();
    tandem::heartbeat();
    loss_value = loss.item<double>();  // this rank's loss (the progress line shows rank 0's)
    if (step == first) first_loss = loss_value;
    ckpt.maybe_save(step + 1);
    progress.step(step + 1, loss_value, train.batch_size);
  }
  ckpt.wait();
  if (!export_path.empty()) {
    sdp.export_model(export_path);  // collective: every rank gathers, rank 0 writes
    if (rank == 0) std::printf("exported the trained model to %s\n", export_path.c_str());
  }
  if (rank == 0) {
    std::printf("trained %lld steps at sharding.stage=%d: loss %.3f -> %.3f (a uniform guess "
                "scores %.3f)\n",
                static_cast<long long>(train.steps - first), config.sharding.stage, first_loss,
                loss_value, std::log(256.0));
    if (const auto* allocator = ctx.allocator()) {
      const auto stats = allocator->stats();
      std::printf("peak allocated %.0f MiB, peak reserved %.0f MiB per rank\n",
                  mib(stats.allocated_bytes.peak), mib(stats.reserved_bytes.peak));
    }
    std::printf("final loss %.6f\n", loss_value);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app("tandem example: a model whose training state does not fit, sharded (ZeRO-3)");
    tiny_lm::LmConfig lm;
    lm.dim = 384;
    lm.layers = 8;
    lm.context = 32;
    std::string export_path = "train_sharded.safetensors";
    app.add_option("--context", lm.context, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--dim", lm.dim, "model width")->check(CLI::PositiveNumber);
    app.add_option("--heads", lm.heads, "attention heads (must divide --dim)")
        ->check(CLI::PositiveNumber);
    app.add_option("--layers", lm.layers, "transformer blocks")->check(CLI::PositiveNumber);
    app.add_option("--export", export_path, "the trained model, for inference (empty: none)");
    if (const int status = examples::parse_flags(app, ctx.argc(), ctx.argv()); status >= 0)
      return status;
    if (lm.dim % lm.heads != 0)
      throw tandem::ConfigError("--heads " + std::to_string(lm.heads) + " does not divide --dim " +
                                std::to_string(lm.dim));
    return train(ctx, lm, export_path);
  });
}
