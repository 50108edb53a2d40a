// Internal to the data-parallel wrappers (runtime/ddp, runtime/sharded): the one grad-ready hook
// and the one walk of the autograd graph they share.
//
// GradAccumulators puts a post hook on every parameter's AccumulateGrad node: once backward has
// accumulated parameter i's gradient, the hook calls listener->on_grad_ready(i) on the autograd
// thread that ran the node. The hooks hold the listener weakly (they do nothing once it is gone)
// and the nodes are kept alive here, because they own the hooks. reachable() answers which
// parameters a backward from `outputs` will reach, counting an output that is itself a parameter.
// Thread-safety: hooks fire on autograd threads; the listener locks what it shares.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace tandem::detail {

class GradReadyListener {
 public:
  virtual ~GradReadyListener() = default;
  virtual void on_grad_ready(int64_t param) = 0;
};

class GradAccumulators {
 public:
  GradAccumulators() = default;
  // `params` are leaf tensors requiring grad.
  GradAccumulators(const std::vector<at::Tensor>& params, std::weak_ptr<GradReadyListener> listener);

  // Parameter i is reached (1) when backward from `outputs` runs through its AccumulateGrad.
  std::vector<char> reachable(const std::vector<at::Tensor>& outputs) const;

 private:
  std::vector<std::shared_ptr<torch::autograd::Node>> nodes_;
  std::unordered_map<const torch::autograd::Node*, int64_t> index_;
};

}  // namespace tandem::detail
