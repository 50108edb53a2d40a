#include <tandem/runtime/grad_scaler.h>

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <ATen/autocast_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <map>
#include <tuple>

namespace tandem {

GradScaler::GradScaler(GradScalerOptions options, std::shared_ptr<Communicator> group)
    : options_(options), group_(std::move(group)) {
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
  scale_ = at::full({1}, static_cast<float>(options_.init_scale), at::kFloat);
  growth_tracker_ = at::zeros({1}, at::kInt);
  found_inf_ = at::zeros({1}, at::kFloat);
}

void GradScaler::place(const c10::Device& device) {
  if (placed_ || scale_.device() == device) {
    placed_ = true;
    return;
  }
  scale_ = scale_.to(device);
  growth_tracker_ = growth_tracker_.to(device);
  found_inf_ = found_inf_.to(device);
  placed_ = true;
}

GradScaler::Stage& GradScaler::stage_of(torch::optim::Optimizer& optimizer) {
  return stages_.emplace(&optimizer, Stage::kReady).first->second;
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  place(loss.device());
  // In float32 whatever the loss's dtype (as PyTorch, whose scale is a float32 tensor): the
  // scaled loss itself cannot overflow; the cast back in backward is where fp16 overflows show.
  return loss.to(at::kFloat) * scale_.to(loss.device(), /*non_blocking=*/true);
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
  torch::autograd::AutoGradMode no_grad(false);
  // The fused kernel takes gradients of one device (and, for its fast path, one dtype) at once:
  // groups keyed by (device type, index, dtype).
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> groups;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      groups[{static_cast<int>(g.device().type()), g.device().index(),
              static_cast<int>(g.scalar_type())}].push_back(g);
    }
  }
  if (!placed_ && !groups.empty()) place(groups.begin()->second.front().device());
  // As PyTorch: the reciprocal in float64, rounded to float32; a value is checked before it is
  // multiplied by it.
  const at::Tensor inv = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found = at::zeros({1}, scale_.options());
  for (auto& [key, grads] : groups) {
    const c10::Device device = grads.front().device();
    at::Tensor found_here = device == found.device() ? found : at::zeros({1}, found.options().device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_here, inv.to(device, true));
    if (!found_here.is_same(found)) found.add_(found_here.to(found.device(), true));
  }
  // Every rank learns whether any rank found one, and all skip alike.
  if (group_ && group_->size() > 1) group_->allreduce(found, ReduceOp::kMax)->wait();
  found_inf_.add_(found);
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
  if (found_inf()) return false;  // the one host read of the step
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
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  found_inf_.zero_();
  any_step_ = false;
  stages_.clear();
}

double GradScaler::get_scale() const { return scale_.item<float>(); }
int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int32_t>(); }
bool GradScaler::found_inf() const { return found_inf_.item<float>() > 0; }

std::map<std::string, CheckpointValue> GradScaler::state() const {
  return {{"scale", get_scale()}, {"growth_tracker", growth_tracker()}};
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
  scale_.fill_(static_cast<float>(std::get<double>(scale->second)));
  growth_tracker_.fill_(static_cast<int32_t>(std::get<int64_t>(tracker->second)));
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
