// Low-precision parameters with fp32 master weights, for DistributedDataParallel and every stage of
// ShardedDataParallel (docs/mixed_precision.md).
//
//   ddp_options.mixed_precision.param_dtype = at::kBFloat16;   // --set precision.param_dtype=bf16
//   tandem::DistributedDataParallel ddp(model, world, ddp_options);
//   torch::optim::AdamW opt(ddp.parameters(), lr);             // the fp32 masters
//
// With param_dtype bf16 or fp16 the wrapper keeps an fp32 copy of every trainable parameter (the
// master; sharded under ShardedDataParallel stage >= 1) and casts the model's own parameters (and
// frozen ones) to param_dtype, so forward and backward run in it. Floating-point tensor inputs of
// the wrapper's forward are cast to param_dtype too (outputs are left as the model makes them).
// Gradients are copied into fp32 buckets and reduced in fp32 (reduce_in_fp32, the default), or
// reduced in param_dtype and cast up afterwards; either way the masters' .grad are fp32 averages,
// the optimizer steps the masters, and the next forward casts them into the model. Checkpoints
// written through the wrapper's register_checkpoint() store the masters, so a resume is exact.
//
// Ownership: plain values. Thread-safety: none needed. Errors: the wrappers throw ConfigError for a
// param_dtype other than float32, bfloat16 and float16.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem {

struct MixedPrecisionOptions {
  // precision.param_dtype: the dtype forward and backward run in (kFloat: mixed precision off).
  at::ScalarType param_dtype = at::kFloat;
  // precision.reduce_in_fp32: reduce gradients in float32 (true) or in param_dtype (false).
  bool reduce_in_fp32 = true;

  bool enabled() const { return param_dtype != at::kFloat; }
  // The dtype gradients are reduced in.
  at::ScalarType reduce_dtype() const { return reduce_in_fp32 ? at::kFloat : param_dtype; }
};

// Throws ConfigError unless `options.param_dtype` is float32, bfloat16 or float16; `who` names the
// wrapper in the message.
void check_mixed_precision(const MixedPrecisionOptions& options, const std::string& who);

namespace detail {

// What the wrapper's forward passes on to the module: floating-point tensors cast to `dtype`
// (kUndefined: unchanged), anything else as it is.
inline at::Tensor cast_input(const at::Tensor& t, at::ScalarType dtype) {
  if (dtype == at::ScalarType::Undefined || !t.defined() || !t.is_floating_point() ||
      t.scalar_type() == dtype) {
    return t;
  }
  return t.to(dtype);
}
inline std::vector<at::Tensor> cast_input(const std::vector<at::Tensor>& ts, at::ScalarType dtype) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(cast_input(t, dtype));
  return out;
}
template <class T, class = std::enable_if_t<!std::is_same_v<std::decay_t<T>, at::Tensor> &&
                                            !std::is_same_v<std::decay_t<T>, std::vector<at::Tensor>>>>
T&& cast_input(T&& value, at::ScalarType) {
  return std::forward<T>(value);
}

}  // namespace detail

}  // namespace tandem
