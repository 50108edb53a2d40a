// Worker of the mixed-precision process tests, started by tandemrun. Reads tandem's config through
// run_main: sharding.stage (0: DistributedDataParallel, 1-3: ShardedDataParallel),
// precision.param_dtype / precision.scaler.*, train.steps, checkpoint.*. Every rank prints
// "STEP <rank> <step> <stepped 0|1> <scale>" per step and, at the end, "CHECKSUM <rank> <hex>" of
// the fp32 masters (all of them: a sharded rank gathers the others' shards), and
// "SHADOWED <rank> <n>" in join mode.
//   --mode overflow  an fp16 model (elementwise ops: CPU has no fp16 matmul) with a GradScaler;
//                    --hot-rank R multiplies rank R's input at step 2 by 1e4, so only it overflows
//   --mode join      bf16 parameters; rank r has 10 batches, odd ranks 13, under tandem::Join
//   --mode resume    bf16 parameters, GradScaler, checkpoints (model masters, optimizer, scaler,
//                    DDP state), resumed at start
#include "tests/sharded/test_model.h"

#include <tandem/tandem.h>

#include <CLI/CLI.hpp>

#include <cinttypes>
#include <cstdio>
#include <functional>

namespace {

using namespace tandem;
using namespace tandem::sharded_test;

// y = sum_i x_i w1_ij + b1, squared, then the same with w2: only ops CPU kernels have for fp16.
struct HalfNetImpl : torch::nn::Module {
  HalfNetImpl() {
    w1 = register_parameter("w1", torch::randn({10, 16}) * 0.3);
    b1 = register_parameter("b1", torch::zeros({16}));
    w2 = register_parameter("w2", torch::randn({16, 5}) * 0.3);
    b2 = register_parameter("b2", torch::zeros({5}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = (x.unsqueeze(2) * w1).sum(1) + b1;
    h = h * h;
    return (h.unsqueeze(2) * w2).sum(1) + b2;
  }
  torch::Tensor w1, b1, w2, b2;
};

// Every rank's fp32 masters, in order; sharded ranks all-gather the shards over the world.
uint64_t master_checksum(Context& ctx, const std::vector<at::Tensor>& masters, bool sharded) {
  Xxh3Stream hash;
  for (const auto& m : masters) {
    at::Tensor t = m.detach().contiguous();
    if (sharded && ctx.world_size() > 1) {
      at::Tensor all = at::empty({t.numel() * ctx.world_size()}, t.options());
      ctx.world()->allgather(all, t)->wait();
      t = all;
    }
    hash.update(t.data_ptr(), t.nbytes());
  }
  return hash.digest();
}

// A wrapper of either kind, seen through what the loop needs.
struct Trainer {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
  tandem::detail::Joinable* joinable = nullptr;
  std::function<void(CheckpointManager&, torch::optim::Optimizer&)> register_state;
  bool sharded = false;
};

template <class Module>
void run(Context& ctx, std::shared_ptr<Module> model, const std::string& mode, int hot_rank) {
  const Config& config = ctx.config();
  DistributedDataParallelOptions ddp_options = small_buckets();
  ddp_options.mixed_precision = config.ddp.mixed_precision;
  std::unique_ptr<DistributedDataParallel<Module>> ddp;
  std::unique_ptr<ShardedDataParallel<Module>> sdp;
  Trainer t;
  if (config.sharding.stage == 0) {
    ddp = std::make_unique<DistributedDataParallel<Module>>(model, ctx.world(), ddp_options);
    t.forward = [&](const at::Tensor& x) { return (*ddp)(x); };
    t.parameters = ddp->parameters();
    t.joinable = &ddp->core();
    t.register_state = [&](CheckpointManager& ckpt, torch::optim::Optimizer& opt) {
      ddp->register_checkpoint(ckpt, "model");
      ckpt.add_optimizer("optim", opt);
      ckpt.add_tensors("ddp", [&] { return ddp->state(); },
                       [&](const std::map<std::string, at::Tensor>& s) { ddp->load_state(s); },
                       Sharding::kSharded);
    };
  } else {
    sdp = std::make_unique<ShardedDataParallel<Module>>(model, ctx.world(), config.sharding, ddp_options);
    t.forward = [&](const at::Tensor& x) { return (*sdp)(x); };
    t.parameters = sdp->parameters();
    t.joinable = &sdp->core();
    t.register_state = [&](CheckpointManager& ckpt, torch::optim::Optimizer& opt) {
      sdp->register_checkpoint(ckpt, "model");
      sdp->register_optimizer(ckpt, "optim", opt);
    };
    t.sharded = true;
  }
  torch::optim::AdamW opt(t.parameters, torch::optim::AdamWOptions(1e-2));
  GradScaler scaler(config.scaler_options(), ctx.world());

  std::unique_ptr<CheckpointManager> ckpt;
  int64_t first = 0;
  if (mode == "resume") {
    CheckpointManagerOptions c = config.checkpoint;
    c.communicator = ctx.world();
    c.async = false;
    ckpt = std::make_unique<CheckpointManager>(c);
    t.register_state(*ckpt, opt);
    scaler.register_checkpoint(*ckpt, "scaler");
    first = ckpt->resume();
  }
  const auto step_once = [&](int64_t step) {
    opt.zero_grad();
    Batch b = batch_of(ctx.rank(), static_cast<int>(step));
    if (ctx.rank() == hot_rank && step == 2) b.x = b.x * 1e4;
    auto out = t.forward(b.x);
    auto loss = (out - b.y).pow(2).mean();
    scaler.scale(loss).backward();
    scaler.unscale(opt);
    clip_grad_norm(t.parameters, 10.0, 2.0, t.sharded ? ctx.world().get() : nullptr);
    const bool stepped = scaler.step(opt);
    scaler.update();
    std::printf("STEP %d %lld %d %.9g\n", ctx.rank(), static_cast<long long>(step), stepped ? 1 : 0,
                scaler.get_scale());
  };
  if (mode == "join") {
    const int64_t batches = ctx.rank() % 2 == 1 ? 13 : 10;
    Join join(*t.joinable, [&] {
      scaler.unscale(opt);
      clip_grad_norm(t.parameters, 10.0, 2.0, t.sharded ? ctx.world().get() : nullptr);
      scaler.step(opt);
      scaler.update();
    });
    for (int64_t step = 0; step < batches; ++step) step_once(step);
    join.finish();
    std::printf("SHADOWED %d %lld\n", ctx.rank(), static_cast<long long>(join.shadowed_steps()));
  } else {
    for (int64_t step = first; step < config.train.steps; ++step) {
      step_once(step);
      if (ckpt) ckpt->maybe_save(step + 1);
    }
  }
  std::printf("CHECKSUM %d %016" PRIx64 "\n", ctx.rank(), master_checksum(ctx, t.parameters, t.sharded));
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app{"mixed-precision process-test worker"};
    std::string mode = "overflow";
    int hot_rank = -1;
    app.add_option("--mode", mode)->check(CLI::IsMember({"overflow", "join", "resume"}));
    app.add_option("--hot-rank", hot_rank);
    app.parse(ctx.argc(), ctx.argv());
    if (mode == "overflow") {
      torch::manual_seed(11);
      run(ctx, std::make_shared<HalfNetImpl>(), mode, hot_rank);
    } else {
      run(ctx, make_net(7), mode, hot_rank);
    }
  });
}
