// Global gradient-norm clipping (include/tandem/runtime/grad_norm.h).
#include <tandem/runtime/grad_norm.h>

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/full_like.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <string>

namespace tandem {

namespace {

void check_norm_type(double norm_type) {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  if (!inf && !(norm_type > 0)) {
    throw ConfigError("tandem: clip_grad_norm: norm_type must be a positive number or inf, got " +
                      std::to_string(norm_type) + ".");
  }
}

// The global norm as a float64 tensor [1] on the gradients' device (the first one's, when they
// span several), computed there without reading it back: |g|^p summed per gradient in float64
// and added up in parameter order (the arithmetic of a host loop), one all-reduce over `group`.
at::Tensor norm_tensor(const std::vector<at::Tensor>& parameters, double norm_type,
                       Communicator* group) {
  check_norm_type(norm_type);
  const bool inf = std::isinf(norm_type);
  at::Tensor total;
  for (const auto& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    if (!total.defined()) total = at::zeros({1}, g.options().dtype(at::kDouble));
    const at::Tensor a = g.detach().to(at::kDouble).abs();
    if (inf) {
      // NaN is reported as inf: a max (here and in the all-reduce) would drop it.
      const at::Tensor m = a.max().reshape({1}).to(total.device(), true);
      total = at::maximum(total, at::where(m.isnan(), at::full_like(m, HUGE_VAL), m));
    } else {
      total.add_((norm_type == 2.0 ? a.mul(a) : a.pow(norm_type)).sum().to(total.device(), true));
    }
  }
  if (!total.defined()) total = at::zeros({1}, at::kDouble);
  if (group != nullptr && group->size() > 1) {
    group->allreduce(total, inf ? ReduceOp::kMax : ReduceOp::kSum)->wait();
  }
  if (inf) return total;
  return norm_type == 2.0 ? total.sqrt() : total.pow(1.0 / norm_type);
}

}  // namespace

double global_grad_norm(const std::vector<at::Tensor>& parameters, double norm_type,
                        Communicator* group) {
  torch::autograd::AutoGradMode no_grad(false);
  return norm_tensor(parameters, norm_type, group).item<double>();
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                      Communicator* group) {
  if (!(max_norm > 0)) {
    throw ConfigError("tandem: clip_grad_norm: max_norm must be positive, got " +
                      std::to_string(max_norm) + ".");
  }
  torch::autograd::AutoGradMode no_grad(false);
  const at::Tensor norm = norm_tensor(parameters, norm_type, group);
  // On the device, no read back: the factor is max_norm / (norm + 1e-6) capped at 1, and 1 for a
  // norm that is not finite (an overflow that GradScaler skips; scaling by 0 or NaN would corrupt
  // the weights of an optimizer that steps anyway).
  // A 0-dim tensor, so that it multiplies in each gradient's dtype, as a scalar would.
  const at::Tensor factor =
      at::where(norm.isfinite(), at::full_like(norm, max_norm).div_(norm.add(1e-6)).clamp_max_(1.0),
                at::ones_like(norm))
          .reshape({});
  for (const auto& p : parameters) {
    if (p.grad().defined()) p.grad().mul_(factor.to(p.grad().device(), true));
  }
  return norm.item<double>();  // the one host read
}

}  // namespace tandem
