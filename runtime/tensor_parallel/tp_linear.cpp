// Column- and row-parallel linear layers (tensor_parallel.h).
#include <tandem/runtime/tensor_parallel.h>

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/linear.h>

#include <string>
#include <utility>

namespace tandem {
namespace {

// This rank's `n / tp` slice of `n` features along `dim` of `t`, as a parameter of its own.
at::Tensor slice_of(const at::Tensor& t, int64_t dim, const Communicator& tp, const char* layer) {
  const int64_t n = t.size(dim);
  if (n % tp.size() != 0) {
    throw ConfigError(std::string("tandem: ") + layer + " of " + std::to_string(n) +
                      " features cannot split over " + std::to_string(tp.size()) +
                      " tensor-parallel ranks; choose --set parallel.tp=N with N dividing " +
                      std::to_string(n) + ".");
  }
  const int64_t k = n / tp.size();
  torch::autograd::AutoGradMode no_grad(false);
  return t.narrow(dim, tp.rank() * k, k).clone();
}

torch::nn::Linear plain_linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

const std::shared_ptr<Communicator>& checked(const std::shared_ptr<Communicator>& tp,
                                             const char* layer) {
  if (!tp) throw ConfigError(std::string("tandem: ") + layer + ": the tensor-parallel group is null.");
  return tp;
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   std::shared_ptr<Communicator> tp,
                                                   ColumnParallelOptions options)
    : ColumnParallelLinearImpl(*plain_linear(in_features, out_features, options.bias),
                               std::move(tp), options) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::LinearImpl& plain,
                                                   std::shared_ptr<Communicator> tp,
                                                   ColumnParallelOptions options)
    : tp_(checked(tp, "ColumnParallelLinear")), options_(options) {
  weight = register_parameter("weight", slice_of(plain.weight, 0, *tp_, "ColumnParallelLinear"));
  if (options_.bias && plain.bias.defined()) {
    bias = register_parameter("bias", slice_of(plain.bias, 0, *tp_, "ColumnParallelLinear"));
  }
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor input = options_.sequence_parallel ? gather_sequence_parallel(x, tp_)
                                                      : copy_to_tensor_parallel(x, tp_);
  at::Tensor y = at::linear(input, weight, bias);
  return options_.gather_output ? gather_from_tensor_parallel(y, tp_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                                             std::shared_ptr<Communicator> tp,
                                             RowParallelOptions options)
    : RowParallelLinearImpl(*plain_linear(in_features, out_features, options.bias), std::move(tp),
                            options) {}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::LinearImpl& plain,
                                             std::shared_ptr<Communicator> tp,
                                             RowParallelOptions options)
    : tp_(checked(tp, "RowParallelLinear")), options_(options) {
  weight = register_parameter("weight", slice_of(plain.weight, 1, *tp_, "RowParallelLinear"));
  if (options_.bias && plain.bias.defined()) {
    torch::autograd::AutoGradMode no_grad(false);
    bias = register_parameter("bias", plain.bias.clone());
  }
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor input = options_.input_is_parallel ? x : scatter_to_tensor_parallel(x, tp_);
  const at::Tensor partial = at::linear(input, weight);
  // The bias is added once, after the sum of the partial products.
  at::Tensor y = options_.sequence_parallel ? reduce_scatter_sequence_parallel(partial, tp_)
                                            : reduce_from_tensor_parallel(partial, tp_);
  return bias.defined() ? y + bias : y;
}

std::vector<at::Tensor> tensor_parallel_partial_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& m : module.modules()) {
    const auto* row = dynamic_cast<const RowParallelLinearImpl*>(m.get());
    if (row != nullptr && row->options().sequence_parallel && row->bias.defined()) {
      out.push_back(row->bias);
    }
  }
  return out;
}

}  // namespace tandem
