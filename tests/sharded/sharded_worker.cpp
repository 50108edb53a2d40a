// Worker of the ShardedDataParallel process tests, started by tandemrun. Reads tandem's config
// (--set sharding.stage=N, train.steps, checkpoint.*) through run_main and trains the test model
// (tests/sharded/test_model.h) with AdamW: sharding.stage 0 under DistributedDataParallel, 1-3
// under ShardedDataParallel. Prints "LOSS <step> <loss>" on rank 0 for every step it runs and,
// with --out FILE, writes the final model there as safetensors (sharded: export_model).
//   --mode train           the above
//   --mode reshard         every world size sees the same global batch of 12 rows per step;
//                          checkpoints (checkpoint.* keys) through register_checkpoint/optimizer,
//                          resumed at start; prints "GLOBAL_LOSS <step> <loss>" on rank 0
//   --mode units-differ    rank 1 builds an extra layer: construction fails on every rank
//   --mode nested          a ShardedUnit inside a ShardedUnit: a parameter in two units
//   --mode wrong-optimizer the optimizer is built over the model's parameters
#include "tests/sharded/test_model.h"

#include <tandem/tandem.h>

#include <CLI/CLI.hpp>

#include <cstdio>

namespace {

using namespace tandem;
using namespace tandem::sharded_test;

struct NestedImpl : torch::nn::Module {
  NestedImpl() { inner = register_module("inner", ShardedUnit<BlockImpl>(Block())); }
  torch::Tensor forward(const torch::Tensor& x) { return inner(x); }
  ShardedUnit<BlockImpl> inner{nullptr};
};

// Rank 0 writes the plain model's parameters (DistributedDataParallel replicas are identical).
void write_model(torch::nn::Module& model, const std::string& path) {
  std::vector<TensorRecord> records;
  std::vector<at::Tensor> tensors;
  for (auto& p : model.named_parameters()) {
    TensorRecord r;
    r.name = p.key();
    r.dtype = to_checkpoint_dtype(p.value().scalar_type());
    r.shape = p.value().sizes().vec();
    at::Tensor c = p.value().detach().contiguous();
    r.xxh3 = xxh3_64(c.data_ptr(), c.nbytes());
    records.push_back(r);
    tensors.push_back(c);
  }
  SafetensorsWriter out(nullptr, path, records);
  for (auto& t : tensors) out.write(t);
  out.commit();
}

template <class Wrapper>
void train(Context& ctx, Wrapper& model_call, torch::optim::Optimizer& opt, int64_t steps) {
  for (int64_t step = 0; step < steps; ++step) {
    opt.zero_grad();
    Batch b = batch_of(ctx.rank(), static_cast<int>(step));
    auto loss = torch::mse_loss(model_call(b.x), b.y);
    loss.backward();
    opt.step();
    if (ctx.rank() == 0) std::printf("LOSS %lld %.9g\n", static_cast<long long>(step), loss.template item<double>());
  }
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app{"ShardedDataParallel process-test worker"};
    std::string mode = "train", out;
    app.add_option("--mode", mode)
        ->check(CLI::IsMember({"train", "reshard", "units-differ", "nested", "wrong-optimizer"}));
    app.add_option("--out", out);
    app.parse(ctx.argc(), ctx.argv());
    const Config& config = ctx.config();
    if (mode == "nested") {
      struct OuterImpl : torch::nn::Module {
        OuterImpl() { outer = register_module("outer", ShardedUnit<NestedImpl>(std::make_shared<NestedImpl>())); }
        ShardedUnit<NestedImpl> outer{nullptr};
      };
      ShardedDataParallel sdp(std::make_shared<OuterImpl>(), ctx.world(), config.sharding, small_buckets());
      std::printf("no error although a parameter is in two units\n");
      return;
    }
    auto model = make_net(7, false, /*unused=*/mode == "units-differ" && ctx.rank() == 1);
    if (config.sharding.stage == 0) {
      DistributedDataParallel ddp(model, ctx.world(), small_buckets());
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
      train(ctx, ddp, opt, config.train.steps);
      if (!out.empty() && ctx.rank() == 0) write_model(*model, out);
      return;
    }
    ShardedDataParallel sdp(model, ctx.world(), config.sharding, small_buckets());
    if (mode == "wrong-optimizer") {
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
      sdp.core().check_optimizer_parameters(opt.param_groups()[0].params());
      std::printf("no error although the optimizer holds the model's parameters\n");
      return;
    }
    torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
    if (mode == "reshard") {
      CheckpointManagerOptions c = config.checkpoint;
      c.communicator = ctx.world();
      CheckpointManager ckpt(c);
      sdp.register_checkpoint(ckpt, "model");
      sdp.register_optimizer(ckpt, "optim", opt);
      for (int64_t step = ckpt.resume(); step < config.train.steps; ++step) {
        opt.zero_grad();
        Batch b = global_batch_part(ctx.rank(), ctx.world_size(), static_cast<int>(step));
        auto loss = torch::mse_loss(sdp(b.x), b.y);
        loss.backward();
        opt.step();
        at::Tensor total = loss.detach().reshape({1}) / ctx.world_size();
        ctx.world()->allreduce(total)->wait();
        if (ctx.rank() == 0) std::printf("GLOBAL_LOSS %lld %.9g\n", static_cast<long long>(step), total.item<double>());
        ckpt.maybe_save(step + 1);
      }
      ckpt.wait();
      return;
    }
    train(ctx, sdp, opt, config.train.steps);
    if (!out.empty()) sdp.export_model(out);
  });
}
