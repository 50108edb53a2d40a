// Internal to runtime/activation: the state a recompute must replay from its forward: the default
// CPU/CUDA generators' RNG state and the autocast settings, and a guard that puts them in place
// for the recompute and the caller's back afterwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <utility>
#include <vector>

namespace tandem::detail {

struct RngState {
  bool captured = false;
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> cuda;
};

// The default CPU generator's state and that of every CUDA device the inputs live on.
RngState capture_rng(const std::vector<at::Tensor>& inputs);

struct AutocastState {
  bool cpu_enabled = false;
  bool gpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType gpu_dtype = at::kHalf;
};

AutocastState capture_autocast();

// Puts the forward's RNG and autocast state in place for the recompute; the destructor puts the
// caller's back (also when fn throws).
class RecomputeStateGuard {
 public:
  RecomputeStateGuard(const RngState& rng, const AutocastState& autocast);
  ~RecomputeStateGuard();
  RecomputeStateGuard(const RecomputeStateGuard&) = delete;
  RecomputeStateGuard& operator=(const RecomputeStateGuard&) = delete;

 private:
  RngState caller_rng_;
  AutocastState caller_autocast_;
  bool nested_ = false;
};

}  // namespace tandem::detail
