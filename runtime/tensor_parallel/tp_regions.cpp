// The tensor-parallel region ops (tensor_parallel.h): each a forward collective (or none) and the
// opposite one in backward, as one autograd node over a pair of functions.
#include <tandem/runtime/tensor_parallel.h>

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <functional>
#include <string>
#include <utility>

namespace tandem {
namespace {

using Fn = std::function<at::Tensor(const at::Tensor&)>;

// The backward of a region op: its gradient function on the one incoming gradient.
class RegionNode final : public torch::autograd::Node {
 public:
  RegionNode(const char* name, Fn backward) : name_(name), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    torch::autograd::AutoGradMode no_grad(false);  // no double backward through collectives
    return {backward_(grads[0])};
  }

 private:
  const char* name_;
  Fn backward_;
};

// `forward(x)` with `backward` as its gradient (when x requires one).
at::Tensor region(const char* name, const at::Tensor& x, const Fn& forward, Fn backward) {
  at::Tensor y;
  {
    torch::autograd::AutoGradMode no_grad(false);
    y = forward(x);
  }
  if (torch::autograd::GradMode::is_enabled() && x.requires_grad()) {
    auto node = std::shared_ptr<RegionNode>(new RegionNode(name, std::move(backward)),
                                            torch::autograd::deleteNode);
    node->set_next_edges({torch::autograd::impl::gradient_edge(x)});
    y = y.detach();  // a tensor of its own, whatever `forward` returned
    torch::autograd::set_history(y, node);
  }
  return y;
}

void check_group(const std::shared_ptr<Communicator>& tp, const char* op) {
  if (!tp) throw ConfigError(std::string("tandem: ") + op + ": the tensor-parallel group is null.");
}

void check_divides(const at::Tensor& x, int64_t dim, int tp, const char* op) {
  if (x.dim() == 0 || x.size(dim) % tp != 0) {
    throw ConfigError(std::string("tandem: ") + op + ": dimension " + std::to_string(dim) +
                      " of a tensor of shape " + c10::str(x.sizes()) + " does not split over " +
                      std::to_string(tp) + " tensor-parallel ranks; choose --set parallel.tp=" +
                      "N with N dividing it, or pad it.");
  }
}

at::Tensor all_reduced(const at::Tensor& x, Communicator& tp) {
  at::Tensor out = x.contiguous().clone();
  if (tp.size() > 1) tp.allreduce(out)->wait();
  return out;
}

// Every rank's `x` concatenated along `dim` (0 or the last).
at::Tensor all_gathered(const at::Tensor& x, Communicator& tp, int64_t dim) {
  if (tp.size() == 1) return x.contiguous().clone();
  const at::Tensor in = x.contiguous();
  std::vector<int64_t> shape{tp.size()};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor stacked = at::empty(shape, in.options());
  tp.allgather(stacked, in)->wait();
  if (dim == 0) return stacked.flatten(0, 1);  // rank-major along the first dimension already
  return at::cat(stacked.unbind(0), dim);
}

// This rank's chunk of `x` along `dim`.
at::Tensor own_chunk(const at::Tensor& x, Communicator& tp, int64_t dim) {
  const int64_t n = x.size(dim) / tp.size();
  return x.narrow(dim, tp.rank() * n, n).contiguous();
}

// Sum over ranks of `x`, this rank's chunk along the first dimension.
at::Tensor reduce_scattered(const at::Tensor& x, Communicator& tp) {
  if (tp.size() == 1) return x.contiguous().clone();
  const at::Tensor in = x.contiguous();
  std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end());
  shape[0] /= tp.size();
  at::Tensor out = at::empty(shape, in.options());
  tp.reduce_scatter(out, in)->wait();
  return out;
}

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  check_group(tp, "copy_to_tensor_parallel");
  return region("tandem::CopyToTensorParallel", x, [](const at::Tensor& t) { return t; },
                [tp](const at::Tensor& g) { return all_reduced(g, *tp); });
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  check_group(tp, "reduce_from_tensor_parallel");
  return region("tandem::ReduceFromTensorParallel", x,
                [tp](const at::Tensor& t) { return all_reduced(t, *tp); },
                [](const at::Tensor& g) { return g; });
}

at::Tensor gather_from_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  check_group(tp, "gather_from_tensor_parallel");
  const int64_t last = x.dim() - 1;
  return region("tandem::GatherFromTensorParallel", x,
                [tp, last](const at::Tensor& t) { return all_gathered(t, *tp, last); },
                [tp, last](const at::Tensor& g) { return own_chunk(g, *tp, last); });
}

at::Tensor scatter_to_tensor_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  check_group(tp, "scatter_to_tensor_parallel");
  const int64_t last = x.dim() - 1;
  check_divides(x, last, tp->size(), "scatter_to_tensor_parallel");
  return region("tandem::ScatterToTensorParallel", x,
                [tp, last](const at::Tensor& t) { return own_chunk(t, *tp, last); },
                [tp, last](const at::Tensor& g) { return all_gathered(g, *tp, last); });
}

at::Tensor gather_sequence_parallel(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  check_group(tp, "gather_sequence_parallel");
  return region("tandem::GatherSequenceParallel", x,
                [tp](const at::Tensor& t) { return all_gathered(t, *tp, 0); },
                [tp](const at::Tensor& g) { return reduce_scattered(g, *tp); });
}

at::Tensor reduce_scatter_sequence_parallel(const at::Tensor& x,
                                            const std::shared_ptr<Communicator>& tp) {
  check_group(tp, "reduce_scatter_sequence_parallel");
  check_divides(x, 0, tp->size(), "reduce_scatter_sequence_parallel");
  return region("tandem::ReduceScatterSequenceParallel", x,
                [tp](const at::Tensor& t) { return reduce_scattered(t, *tp); },
                [tp](const at::Tensor& g) { return all_gathered(g, *tp, 0); });
}

}  // namespace tandem
