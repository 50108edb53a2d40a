// The RNG and autocast state an activation checkpoint replays in its recompute
// (runtime/activation/recompute_state.h).
#include "runtime/activation/recompute_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <torch/version.h>

#include <algorithm>
#include <mutex>

namespace tandem::detail {
namespace {

at::Tensor get_generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The CUDA devices the inputs live on (none on CPU-only builds: nothing to capture).
std::vector<c10::Device> cuda_devices(const std::vector<at::Tensor>& inputs) {
  std::vector<c10::Device> devices;
  for (const auto& t : inputs) {
    if (!t.defined() || !t.is_cuda()) continue;
    const c10::Device d = t.device();
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  }
  return devices;
}

// The caller's state for the same generators as `like`.
RngState capture_like(const RngState& like) {
  RngState s;
  s.captured = like.captured;
  if (!like.captured) return s;
  s.cpu = get_generator_state(at::detail::getDefaultCPUGenerator());
  for (const auto& entry : like.cuda) {
    s.cuda.emplace_back(entry.first,
                        get_generator_state(at::globalContext().defaultGenerator(entry.first)));
  }
  return s;
}

void restore_rng(const RngState& s) {
  if (!s.captured) return;
  set_generator_state(at::detail::getDefaultCPUGenerator(), s.cpu);
  for (const auto& entry : s.cuda) {
    set_generator_state(at::globalContext().defaultGenerator(entry.first), entry.second);
  }
}

void apply_autocast(const AutocastState& s) {
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu_enabled);
  at::autocast::set_autocast_enabled(at::kCUDA, s.gpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_dtype(at::kCUDA, s.gpu_dtype);
}

}  // namespace

RngState capture_rng(const std::vector<at::Tensor>& inputs) {
  RngState s;
  s.captured = true;
  s.cpu = get_generator_state(at::detail::getDefaultCPUGenerator());
  // CUDA tensors exist only on CUDA builds; the generators are reached through the Context, so
  // this compiles (and is never entered) against a CPU-only libtorch.
  for (const auto& d : cuda_devices(inputs)) {
    s.cuda.emplace_back(d, get_generator_state(at::globalContext().defaultGenerator(d)));
  }
  return s;
}

AutocastState capture_autocast() {
  AutocastState s;
  s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  s.gpu_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.gpu_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  return s;
}

RecomputeStateGuard::RecomputeStateGuard(const RngState& rng, const AutocastState& autocast)
    : caller_rng_(capture_like(rng)), caller_autocast_(capture_autocast()) {
  restore_rng(rng);
  apply_autocast(autocast);
  nested_ = autocast.cpu_enabled || autocast.gpu_enabled;
  if (nested_) at::autocast::increment_nesting();
}

RecomputeStateGuard::~RecomputeStateGuard() {
  // Like leaving an autocast region: the cast cache is dropped when the outermost one ends.
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply_autocast(caller_autocast_);
  restore_rng(caller_rng_);
}

}  // namespace tandem::detail
