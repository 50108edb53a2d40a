// Mixed precision for libtorch C++: dynamic loss scaling (what torch.amp.GradScaler does in
// Python, pytorch#44710) agreed across ranks, and an RAII guard over ATen's autocast.
//
//   tandem::GradScaler scaler(ctx.config().precision.scaler, ctx.world());
//   tandem::AutocastGuard autocast(at::kCPU, at::kBFloat16);   // or from precision.autocast
//   auto loss = loss_fn(model(x));
//   scaler.scale(loss).backward();
//   scaler.unscale(opt);                 // optional: before clipping
//   sdp.clip_grad_norm(1.0);
//   scaler.step(opt);                    // skipped when any rank found an inf or a NaN
//   scaler.update();
//
// GradScaler: scale(loss) multiplies by the current scale (float32, initially 2^16), a tensor on
// the device of the first loss it scales; unscale() divides every gradient of the optimizer by it
// and checks each for inf/NaN with libtorch's fused kernel (_amp_foreach_non_finite_check_and_
// unscale_, one launch per device and dtype), and the verdict, a tensor too, is all-reduced (max)
// over `group`, so every rank - data-parallel replicas, shards of a sharded model, stages of a
// pipeline - skips exactly the same steps. step() unscales if needed and steps unless an inf was
// found: the one place the host reads the device (once per step). update() applies PyTorch's
// rule with its kernel (_amp_update_scale_, on the device): an inf multiplies the scale by
// backoff_factor and restarts the count, `growth_interval` clean steps in a row multiply it by
// growth_factor (if the result is finite). get_scale(), growth_tracker() and found_inf() read
// the device (for logs and tests, not the training loop). The scale and the count are training state
// (state()/load_state(), or register with CheckpointManager::add_values). Disabled, every call is
// a pass-through (scale() returns the loss, step() steps).
// Ownership: shares the group communicator. Thread-safety: one training thread.
// Errors: ConfigError for bad options; tandem::Error for calls out of order, naming the call and
// what to do: unscale() or step() twice for one optimizer in one step, unscale() after step(),
// update() before any step(); CommError/TimeoutError from the agreement.
#pragma once

#include <tandem/checkpoint/format.h>
#include <tandem/collectives/communicator.h>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace torch::optim {
class Optimizer;
}

namespace tandem {

class CheckpointManager;

// Config section precision.scaler (docs/mixed_precision.md); PyTorch's defaults.
struct GradScalerOptions {
  bool enabled = true;
  double init_scale = 65536.0;   // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  // `group`: the ranks that must agree on skipping (usually the world); null: this process only.
  explicit GradScaler(GradScalerOptions options = {}, std::shared_ptr<Communicator> group = nullptr);

  at::Tensor scale(const at::Tensor& loss);
  void unscale(torch::optim::Optimizer& optimizer);
  // True when the optimizer stepped (no rank found an inf or NaN).
  bool step(torch::optim::Optimizer& optimizer);
  void update();

  // Read from the device.
  double get_scale() const;
  int64_t growth_tracker() const;
  // Whether this step found an inf or NaN on some rank (after unscale()/step()).
  bool found_inf() const;
  bool enabled() const { return options_.enabled; }

  std::map<std::string, CheckpointValue> state() const;
  void load_state(const std::map<std::string, CheckpointValue>& state);
  // Adds state() to `ckpt` as replicated values `name` (the scale is the same on every rank).
  void register_checkpoint(CheckpointManager& ckpt, const std::string& name);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  Stage& stage_of(torch::optim::Optimizer& optimizer);

  // The scale state, moved with the first scaled loss to its device.
  void place(const c10::Device& device);

  GradScalerOptions options_;
  std::shared_ptr<Communicator> group_;
  at::Tensor scale_;           // float32 [1]
  at::Tensor growth_tracker_;  // int32 [1]
  at::Tensor found_inf_;       // float32 [1]: > 0 when an inf or NaN was found in this step
  bool placed_ = false;        // scale_ and the rest live on the first loss's device
  bool any_step_ = false;
  std::map<const torch::optim::Optimizer*, Stage> stages_;
};

// Autocast on `device` (CPU: bfloat16; CUDA: float16 or bfloat16) while it lives; the previous
// state (enabled flag and dtype) comes back at destruction, and the cast cache is cleared when
// the outermost guard ends, as torch.autocast does. Not copyable. Thread-safety: autocast state is
// per thread (ATen's); use the guard on the thread that runs the forward.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

}  // namespace tandem
