#include <tandem/runtime/grad_scaler.h>

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <ATen/autocast_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <cstring>

namespace tandem {

GradScaler::GradScaler(GradScalerOptions options, std::shared_ptr<Communicator> group)
    : options_(options), group_(std::move(group)), scale_(static_cast<float>(options.init_scale)) {
  if (!(options_.init_scale > 0) || !std::isfinite(static_cast<float>(options_.init_scale))) {
    throw ConfigError("tandem: GradScaler: init_scale must be positive and finite in float32, got " +
                      std::to_string(options_.init_scale) + " (--set precision.scaler.init_scale).");
  }
  if (!(options_.growth_factor > 1.0) || !(options_.backoff_factor > 0 && options_.backoff_factor < 1.0)) {
    throw ConfigError("tandem: GradScaler: growth_factor must be > 1 and backoff_factor in (0, 1), got " +
                      std::to_string(options_.growth_factor) + " and " +
                      std::to_string(options_.backoff_factor) +
                      " (--set precision.scaler.growth_factor / precision.scaler.backoff_factor).");
  }
  if (options_.growth_interval < 1) {
    throw ConfigError("tandem: GradScaler: growth_interval must be >= 1, got " +
                      std::to_string(options_.growth_interval) +
                      " (--set precision.scaler.growth_interval).");
  }
}

GradScaler::Stage& GradScaler::stage_of(torch::optim::Optimizer& optimizer) {
  return stages_.emplace(&optimizer, Stage::kReady).first->second;
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  // In float32 whatever the loss's dtype (as PyTorch, whose scale is a float32 tensor): the
  // scaled loss itself cannot overflow; the cast back in backward is where fp16 overflows show.
  return loss.to(at::kFloat) * at::scalar_tensor(scale_, loss.options().dtype(at::kFloat));
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  Stage& stage = stage_of(optimizer);
  if (stage == Stage::kUnscaled) {
    throw Error("tandem: GradScaler::unscale() was already called for this optimizer since the "
                "last update(); call it once per step (step() unscales by itself when you did not).");
  }
  if (stage == Stage::kStepped) {
    throw Error("tandem: GradScaler::unscale() after step() for this optimizer: the step already "
                "used the gradients. Call unscale() before step(), and update() after it.");
  }
  // As PyTorch's kernel: a value is checked before it is multiplied by 1 / scale (in float32).
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  bool local_inf = false;
  torch::autograd::AutoGradMode no_grad(false);
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (!local_inf && !g.isfinite().all().item<bool>()) local_inf = true;
      if (inv != 1.0f) g.mul_(inv);
    }
  }
  // Every rank learns whether any rank found one, and all skip alike.
  bool any = local_inf;
  if (group_ && group_->size() > 1) {
    at::Tensor flag = at::empty({1}, at::kInt);
    flag.data_ptr<int32_t>()[0] = local_inf ? 1 : 0;
    group_->allreduce(flag, ReduceOp::kMax)->wait();
    any = flag.data_ptr<int32_t>()[0] != 0;
  }
  found_inf_ = found_inf_ || any;
  stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (stage_of(optimizer) == Stage::kStepped) {
    throw Error("tandem: GradScaler::step() was already called for this optimizer since the last "
                "update(); call update() once per step, after every step().");
  }
  if (stage_of(optimizer) == Stage::kReady) unscale(optimizer);
  stage_of(optimizer) = Stage::kStepped;
  any_step_ = true;
  if (found_inf_) return false;
  wait_for_checkpoint_staging();  // an async save may still copy the parameters
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (!any_step_) {
    throw Error("tandem: GradScaler::update() before any step() since the last update(): there is "
                "no inf check to update from. Call step(optimizer) first.");
  }
  // PyTorch's _amp_update_scale_ (aten/src/ATen/native/cuda/AmpKernels.cu), in float32.
  if (found_inf_) {
    scale_ = scale_ * static_cast<float>(options_.backoff_factor);
    growth_tracker_ = 0;
  } else {
    const int64_t successful = growth_tracker_ + 1;
    if (successful == options_.growth_interval) {
      const float grown = scale_ * static_cast<float>(options_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = successful;
    }
  }
  found_inf_ = false;
  any_step_ = false;
  stages_.clear();
}

std::map<std::string, CheckpointValue> GradScaler::state() const {
  return {{"scale", static_cast<double>(scale_)}, {"growth_tracker", growth_tracker_}};
}

void GradScaler::load_state(const std::map<std::string, CheckpointValue>& state) {
  auto scale = state.find("scale");
  auto tracker = state.find("growth_tracker");
  if (scale == state.end() || tracker == state.end() ||
      !std::holds_alternative<double>(scale->second) ||
      !std::holds_alternative<int64_t>(tracker->second)) {
    throw ConfigError("tandem: GradScaler::load_state(): expected the values 'scale' (float) and "
                      "'growth_tracker' (int) that state() returns.");
  }
  scale_ = static_cast<float>(std::get<double>(scale->second));
  growth_tracker_ = std::get<int64_t>(tracker->second);
}

void GradScaler::register_checkpoint(CheckpointManager& ckpt, const std::string& name) {
  ckpt.add_values(name, [this] { return state(); },
                  [this](const std::map<std::string, CheckpointValue>& s) { load_state(s); });
}

AutocastGuard::AutocastGuard(c10::DeviceType device, at::ScalarType dtype, bool enabled)
    : device_(device) {
  if (device == c10::DeviceType::CPU) {
    if (enabled && dtype != at::kBFloat16) {
      throw ConfigError(std::string("tandem: autocast on CPU runs in bfloat16 only, got ") +
                        c10::toString(dtype) + " (--set precision.autocast=bf16).");
    }
  } else if (device == c10::DeviceType::CUDA) {
    if (enabled && dtype != at::kHalf && dtype != at::kBFloat16) {
      throw ConfigError(std::string("tandem: autocast on CUDA runs in float16 or bfloat16, got ") +
                        c10::toString(dtype) + " (--set precision.autocast=fp16).");
    }
  } else {
    throw ConfigError(std::string("tandem: autocast supports CPU and CUDA, not ") +
                      c10::DeviceTypeName(device) + ".");
  }
  previous_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_enabled(device, enabled);
  if (enabled) at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // The outermost autocast region frees its cache of casted weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

}  // namespace tandem
