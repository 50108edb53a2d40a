// Internal to runtime/ddp: DistributedDataParallel's fp32 master weights under mixed precision
// (tandem/runtime/mixed_precision.h). The model's floating parameters are cast to param_dtype;
// each trainable one gets an fp32 master that the optimizer steps, cast back into the model
// before the next forward when it changed.
#pragma once

#include <tandem/checkpoint/checkpointable.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tandem::detail {

class MasterWeights {
 public:
  // Takes fp32 copies of `trainable` as masters, then casts `trainable` and `frozen` (floating
  // ones) to `dtype` in place (set_data: the parameters keep their identity).
  MasterWeights(std::vector<at::Tensor> trainable, std::vector<at::Tensor> frozen, at::ScalarType dtype);

  const std::vector<at::Tensor>& masters() const { return masters_; }
  // Copies (casting) into its parameter every master changed since the last call, or every
  // master with `all` (after a synchronised backward: libtorch's SGD steps through .data(), which
  // bumps no version counter).
  void cast_into_model(bool all);
  // State kind "module" of `module`: trainable parameters' values from the masters, frozen ones
  // and buffers as fp32 where floating; load() writes the masters (and frozen parameters, buffers).
  std::shared_ptr<Checkpointable> module_state(torch::nn::Module& module);

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> masters_;
  std::vector<int64_t> versions_;  // masters' version counters when last cast into the model
};

}  // namespace tandem::detail
