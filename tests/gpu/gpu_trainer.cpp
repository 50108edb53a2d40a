#include "tests/gpu/gpu_trainer.h"

#include "tests/sharded/sharded_test_util.h"  // borrow()
#include "tests/support/test_support.h"

#include <tandem/checkpoint/format.h>
#include <tandem/runtime/grad_norm.h>

#include <stdexcept>

namespace tandem::gpu_test {

std::string wrapper_name(Wrapper w) {
  switch (w) {
    case Wrapper::kPlain: return "plain";
    case Wrapper::kDdp: return "ddp";
    case Wrapper::kZero1: return "zero1";
    case Wrapper::kZero2: return "zero2";
    case Wrapper::kZero3: return "zero3";
  }
  return "?";
}

namespace {

int stage_of(Wrapper w) {
  return w == Wrapper::kZero1 ? 1 : w == Wrapper::kZero2 ? 2 : 3;
}

}  // namespace

Trainer::Trainer(const Recipe& recipe, Wrapper wrapper, std::shared_ptr<NetImpl> model,
                 std::shared_ptr<Communicator> comm, int world)
    : recipe_(recipe), wrapper_(wrapper), model_(std::move(model)), comm_(std::move(comm)),
      rank_(comm_ ? comm_->rank() : 0), world_(world) {
  DistributedDataParallelOptions options;
  options.mixed_precision.param_dtype = recipe.param_dtype;
  if (wrapper == Wrapper::kPlain) {
    params_ = model_->parameters();  // fp32: the masters under mixed precision
    if (recipe.param_dtype != at::kFloat) {
      low_ = make_net(recipe.size, recipe.seed, recipe.model);
      low_->to(recipe.param_dtype);
    }
  } else if (wrapper == Wrapper::kDdp) {
    ddp_ = std::make_unique<DistributedDataParallel<NetImpl>>(model_, comm_, options);
    params_ = ddp_->parameters();
  } else {
    ShardingOptions sharding;
    sharding.stage = stage_of(wrapper);
    sdp_ = std::make_unique<ShardedDataParallel<NetImpl>>(model_, comm_, sharding, options);
    params_ = sdp_->parameters();
  }
  opt_ = std::make_unique<torch::optim::AdamW>(
      params_, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  if (recipe.scaler) {
    GradScalerOptions o;
    o.growth_interval = recipe.growth_interval;
    scaler_ = std::make_unique<GradScaler>(o, comm_);
  }
  // Dropout's stream starts at the same state in every run (this also seeds the CUDA generators).
  torch::manual_seed(recipe.seed + 1000);
}

Trainer::~Trainer() = default;

at::Tensor Trainer::forward(const at::Tensor& x) {
  if (ddp_) return (*ddp_)(x);
  return (*sdp_)(x);
}

at::Tensor Trainer::loss_of(NetImpl* plain, const Batch& b) {
  AutocastGuard autocast(test_device().type(), recipe_.autocast, recipe_.autocast != at::kFloat);
  // The plain loop casts a floating input to param_dtype, as the wrappers' forward does.
  at::Tensor out = plain != nullptr ? plain->forward(b.x.to(recipe_.param_dtype)) : forward(b.x);
  return torch::mse_loss(out.to(at::kFloat), b.y);
}

void Trainer::backward(const at::Tensor& loss) {
  (scaler_ ? scaler_->scale(loss) : loss).backward();
}

void Trainer::step(int step) {
  opt_->zero_grad();
  if (wrapper_ == Wrapper::kPlain) {
    plain_backward(step);
  } else {
    backward(loss_of(nullptr, batch_of(recipe_.size, rank_, step, recipe_.rows)));
  }
  finish_step();
}

void Trainer::plain_backward(int step) {
  const bool mixed = low_ != nullptr;
  NetImpl& net = mixed ? *low_ : *model_;
  const std::vector<at::Tensor> net_params = net.parameters();
  if (mixed) {  // what the wrappers' next forward does: the masters cast into the model
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net_params.size(); ++i) net_params[i].copy_(params_[i]);
  }
  if (!mixed && world_ == 1) {
    backward(loss_of(&net, batch_of(recipe_.size, 0, step, recipe_.rows)));
    return;
  }
  // Each rank's gradients in turn, cast to fp32 and summed over ranks 0..N-1, then averaged.
  std::vector<at::Tensor> sum(net_params.size());
  for (int r = 0; r < world_; ++r) {
    for (const auto& p : net_params) p.mutable_grad() = at::Tensor();
    backward(loss_of(&net, batch_of(recipe_.size, r, step, recipe_.rows)));
    for (size_t i = 0; i < net_params.size(); ++i) {
      const at::Tensor g = net_params[i].grad().to(at::kFloat);
      sum[i] = r == 0 ? g : sum[i] + g;
    }
  }
  for (auto& p : net_params) p.mutable_grad() = at::Tensor();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].mutable_grad() = world_ == 1 ? sum[i] : sum[i].div(world_);
  }
}

void Trainer::finish_step() {
  if (recipe_.clip > 0) {
    if (scaler_) scaler_->unscale(*opt_);  // clip what the optimizer will see
    norms_.push_back(sdp_ ? sdp_->clip_grad_norm(recipe_.clip)
                          : clip_grad_norm(params_, recipe_.clip));
  }
  bool stepped = true;
  if (scaler_) {
    stepped = scaler_->step(*opt_);
    scaler_->update();
  } else {
    opt_->step();
  }
  stepped_.push_back(stepped);
}

std::vector<MasterSlice> Trainer::masters() const {
  std::vector<MasterSlice> out;
  if (sdp_) {
    for (const auto& s : sdp_->core().parameter_slices()) {
      int64_t numel = 1;
      for (int64_t d : s.shape) numel *= d;
      at::Tensor data = s.data.defined() ? s.data.detach().reshape({-1}).clone()
                                         : at::empty({0}, params_[0].options());
      out.push_back({s.name, numel, s.begin, data});
    }
    return out;
  }
  // The plain loop's model and DDP's parameters() list the trainable parameters in registration
  // order, as named_parameters() does.
  const auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const at::Tensor& value = ddp_ ? params_[i] : named[i].value();
    out.push_back({named[i].key(), value.numel(), 0, value.detach().reshape({-1}).clone()});
  }
  return out;
}

void Trainer::register_checkpoint(CheckpointManager& ckpt) {
  if (ddp_) {
    ddp_->register_checkpoint(ckpt, "model");
    ckpt.add_optimizer("optim", *opt_);
    ckpt.add_tensors(
        "ddp", [this] { return ddp_->state(); },
        [this](const std::map<std::string, at::Tensor>& s) { ddp_->load_state(s); },
        Sharding::kSharded);
  } else if (sdp_) {
    sdp_->register_checkpoint(ckpt, "model");
    sdp_->register_optimizer(ckpt, "optim", *opt_);
  } else {
    ckpt.add_module("model", model_);
    ckpt.add_optimizer("optim", *opt_);
  }
  if (scaler_) scaler_->register_checkpoint(ckpt, "scaler");
}

RunResult train(const Recipe& recipe, Wrapper wrapper, int world) {
  if (recipe.model.dropout > 0 && world != 1) {
    throw std::invalid_argument("train: dropout needs world 1 (threads share one CUDA generator)");
  }
  RunResult result;
  auto collect = [&](const Trainer& t) {
    result.norms = t.norms();
    result.stepped = t.stepped();
  };
  if (wrapper == Wrapper::kPlain || world == 1) {
    auto model = make_net(recipe.size, recipe.seed, recipe.model);
    Distributed dist;
    if (wrapper != Wrapper::kPlain) dist = nccl_world_of_one();
    Trainer t(recipe, wrapper, model, dist.world, world);
    for (int s = 0; s < recipe.steps; ++s) t.step(s);
    result.masters = assemble({t.masters()});
    collect(t);
    return result;
  }
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_net(recipe.size, recipe.seed, recipe.model));
  std::vector<std::vector<MasterSlice>> slices(world);
  testing::run_ranks(world, [&](Communicator& comm) {
    Trainer t(recipe, wrapper, models[comm.rank()], sharded_test::borrow(comm), world);
    for (int s = 0; s < recipe.steps; ++s) t.step(s);
    slices[comm.rank()] = t.masters();
    if (comm.rank() == 0) collect(t);
  });
  if (wrapper == Wrapper::kDdp) {
    for (int r = 1; r < world && result.replica_difference.empty(); ++r) {
      const std::string d = difference(assemble({slices[r]}), assemble({slices[0]}));
      if (!d.empty()) result.replica_difference = "rank " + std::to_string(r) + ": " + d;
    }
  }
  result.masters = assemble(slices);
  return result;
}

std::map<std::string, at::Tensor> initial_masters(const Recipe& recipe) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : make_net(recipe.size, recipe.seed, recipe.model)->named_parameters()) {
    out[p.key()] = p.value().detach().reshape({-1});
  }
  return out;
}

}  // namespace tandem::gpu_test
