// Global gradient-norm clipping (include/tandem/runtime/grad_norm.h).
#include <tandem/runtime/grad_norm.h>

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace tandem {

double global_grad_norm(const std::vector<at::Tensor>& parameters, double norm_type,
                        Communicator* group) {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  if (!inf && !(norm_type > 0)) {
    throw ConfigError("tandem: clip_grad_norm: norm_type must be a positive number or inf, got " +
                      std::to_string(norm_type) + ".");
  }
  torch::autograd::AutoGradMode no_grad(false);
  double local = 0;
  for (const auto& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const at::Tensor a = g.detach().to(at::kDouble).abs();
    if (inf) {
      // NaN is reported as inf: a max (here and in the all-reduce) would drop it.
      const double m = a.max().item<double>();
      local = std::isnan(m) ? HUGE_VAL : std::max(local, m);
    } else {
      local += (norm_type == 2.0 ? a.mul(a) : a.pow(norm_type)).sum().item<double>();
    }
    if (std::isnan(local)) break;
  }
  if (group != nullptr && group->size() > 1) {
    at::Tensor total = at::empty({1}, at::kDouble);
    total.data_ptr<double>()[0] = local;
    group->allreduce(total, inf ? ReduceOp::kMax : ReduceOp::kSum)->wait();
    local = total.data_ptr<double>()[0];
  }
  if (inf) return local;
  return norm_type == 2.0 ? std::sqrt(local) : std::pow(local, 1.0 / norm_type);
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                      Communicator* group) {
  if (!(max_norm > 0)) {
    throw ConfigError("tandem: clip_grad_norm: max_norm must be positive, got " +
                      std::to_string(max_norm) + ".");
  }
  const double norm = global_grad_norm(parameters, norm_type, group);
  // Not finite: an overflow that GradScaler skips; scaling by 0 or NaN would corrupt the weights
  // of an optimizer that steps anyway.
  if (!std::isfinite(norm)) return norm;
  const double scale = max_norm / (norm + 1e-6);
  if (scale >= 1.0) return norm;
  torch::autograd::AutoGradMode no_grad(false);
  for (const auto& p : parameters) {
    if (p.grad().defined()) p.grad().mul_(scale);
  }
  return norm;
}

}  // namespace tandem
