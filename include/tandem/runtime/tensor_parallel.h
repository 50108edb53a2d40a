// Tensor parallelism (Megatron-Core's ColumnParallelLinear / RowParallelLinear, DTensor's
// ColwiseParallel / RowwiseParallel): one layer's weight split over the ranks of a `tp` group,
// each rank computing its slice, with the communication in the forward and backward passes.
//
//   auto tp = mesh.group({"tp"});
//   auto up = tandem::ColumnParallelLinear(1024, 4096, tp);          // output features split
//   auto down = tandem::RowParallelLinear(4096, 1024, tp);           // input features split
//   y = down(torch::gelu(up(x)));   // one all-reduce forward (down), one backward (up's input)
//
// The pair is the Megatron MLP: the column layer's output stays split (no gather), the
// element-wise op runs on the slice, and the row layer sums the partial products of the slices.
// Sequence parallel (options.sequence_parallel, both layers): activations between TP regions are
// split along the first dimension (the sequence); the column layer all-gathers its input along
// it and the row layer reduce-scatters its output along it, instead of a copy and an all-reduce
// (the same bytes on the wire, activations 1/tp the size).
//
// Initialisation: a layer built with the sizes draws a plain torch::nn::Linear of the full shape
// from the global generator (as the plain model would, in the same order) and keeps its slice,
// so a tensor-parallel model built from the same seed starts as the single-process one, bitwise.
// A layer built from a plain Linear takes its slice of that module's weights.
//
// Region ops (each differentiable; `tp` is the group): copy_to_tensor_parallel (forward
// identity, backward all-reduce), reduce_from_tensor_parallel (forward all-reduce, backward
// identity), gather_from_tensor_parallel / scatter_to_tensor_parallel (last dimension),
// gather_sequence_parallel / reduce_scatter_sequence_parallel (first dimension). A backward's
// collective is waited for where the backward runs: on NCCL that only orders the stream, so the
// CUDA autograd thread never blocks on another rank; on Gloo (CPU tensors) the thread that called
// backward waits.
//
// Parameters: a column layer's weight and bias and a row layer's weight are this rank's slices
// (gradients of slices: reduce them over the data-parallel ranks only); a row layer's bias is
// replicated over tp (each tp rank computes the same full gradient, except under sequence
// parallel, where each holds its sequence slice's part: sum them over tp, as
// tensor_parallel_partial_parameters() lists).
//
// Ownership: a layer shares its communicator. Thread-safety: as torch::nn::Module; every rank of
// the group must run the same layers in the same order (collectives). Errors: ConfigError when
// the group's size does not divide the split features (naming `parallel.tp`), or the input's
// split dimension; CommError/TimeoutError from the collectives.
#pragma once

#include <tandem/collectives/communicator.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

namespace tandem {

// The region ops (see the top); backward does the opposite communication. copy_to's result
// shares x's storage, the others' are tensors of their own.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);
at::Tensor gather_from_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);
at::Tensor scatter_to_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);
at::Tensor gather_sequence_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);
at::Tensor reduce_scatter_sequence_parallel(const at::Tensor& x,
                                            const std::shared_ptr<Communicator>& tp);

struct ColumnParallelOptions {
  bool bias = true;
  // All-gather the output's last dimension (the full output on every rank); false: this rank's
  // slice, as the input of a row-parallel layer.
  bool gather_output = false;
  // The input is this rank's slice of the sequence (first dimension): all-gather it.
  bool sequence_parallel = false;
};

struct RowParallelOptions {
  bool bias = true;
  // The input is already this rank's slice of the features (a column layer's output); false:
  // split the full input here.
  bool input_is_parallel = true;
  // Reduce-scatter the output along the sequence (first dimension) instead of all-reducing it.
  bool sequence_parallel = false;
};

// y = x W^T + b with W's rows (output features) split over tp: weight [out / tp, in].
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                           std::shared_ptr<Communicator> tp, ColumnParallelOptions options = {});
  // This rank's slice of `plain`'s weights.
  ColumnParallelLinearImpl(const torch::nn::LinearImpl& plain, std::shared_ptr<Communicator> tp,
                           ColumnParallelOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;
  at::Tensor bias;  // [out / tp]; undefined without bias

 private:
  std::shared_ptr<Communicator> tp_;
  ColumnParallelOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W's columns (input features) split over tp: weight [out, in / tp]; the
// partial products are summed over tp, then b (replicated) is added.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                        std::shared_ptr<Communicator> tp, RowParallelOptions options = {});
  RowParallelLinearImpl(const torch::nn::LinearImpl& plain, std::shared_ptr<Communicator> tp,
                        RowParallelOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;
  at::Tensor bias;  // [out], the same on every tp rank; undefined without bias
  const RowParallelOptions& options() const { return options_; }

 private:
  std::shared_ptr<Communicator> tp_;
  RowParallelOptions options_;
};
TORCH_MODULE(RowParallelLinear);

// The parameters of `module` (recursively) whose gradient each tp rank holds only a part of and
// that must be summed over tp before the optimizer step: row-parallel biases under sequence
// parallel. Empty without sequence parallel.
std::vector<at::Tensor> tensor_parallel_partial_parameters(const torch::nn::Module& module);

}  // namespace tandem
