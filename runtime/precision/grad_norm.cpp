// Global gradient-norm clipping (include/tandem/runtime/grad_norm.h).
#include <tandem/runtime/grad_norm.h>

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace tandem {

namespace {

void check_norm_type(double norm_type) {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  if (!inf && !(norm_type > 0)) {
    throw ConfigError("tandem: clip_grad_norm: norm_type must be a positive number or inf, got " +
                      std::to_string(norm_type) + ".");
  }
}

// The gradients by device and dtype (a fused kernel takes one of each), each with its position
// among all the gradients.
struct GradGroup {
  c10::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> positions;
};
using GradGroups = std::vector<GradGroup>;

GradGroups group_grads(const std::vector<at::Tensor>& gradients, int64_t* count) {
  GradGroups groups;
  *count = 0;
  for (const auto& g : gradients) {
    if (!g.defined() || g.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const GradGroup& group) {
      return group.device == g.device() && group.dtype == g.scalar_type();
    });
    if (it == groups.end()) it = groups.insert(groups.end(), GradGroup{g.device(), g.scalar_type(), {}, {}});
    it->grads.push_back(g.detach());
    it->positions.push_back((*count)++);
  }
  return groups;
}

// The global norm as a float64 tensor [1] on `device`, computed there without reading it back.
// One fused pass per device and dtype (_foreach_norm, as torch.nn.utils.clip_grad_norm_): each
// gradient's norm accumulated in float32 (never a copy of a gradient), then |g_i|^p summed in
// float64 over the gradients in parameter order, and one all-reduce over `group`.
at::Tensor norm_tensor(const GradGroups& groups, int64_t count, c10::Device device,
                       double norm_type, Communicator* group) {
  check_norm_type(norm_type);
  const bool inf = std::isinf(norm_type);
  at::Tensor norms;
  for (const GradGroup& g : groups) {
    // float32 results at least: a float16 gradient's norm can exceed 65504.
    const at::ScalarType out = g.dtype == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor n = at::stack(at::_foreach_norm(g.grads, norm_type, out)).to(device, at::kDouble);
    if (groups.size() == 1) {
      norms = n;
      break;
    }
    if (!norms.defined()) norms = at::empty({count}, n.options());
    norms.index_copy_(0, at::tensor(g.positions, at::kLong).to(device), n);
  }
  if (!norms.defined()) norms = at::zeros({1}, at::TensorOptions(device).dtype(at::kDouble));
  at::Tensor total;
  if (inf) {
    // NaN is reported as inf: a max (here and in the all-reduce) would drop it.
    total = at::where(norms.isnan(), at::full_like(norms, HUGE_VAL), norms).max().reshape({1});
  } else {
    total = (norm_type == 2.0 ? norms.mul(norms) : norms.pow(norm_type)).sum().reshape({1});
  }
  if (group != nullptr && group->size() > 1) {
    group->allreduce(total, inf ? ReduceOp::kMax : ReduceOp::kSum)->wait();
  }
  if (inf) return total;
  return norm_type == 2.0 ? total.sqrt() : total.pow(1.0 / norm_type);
}

// Where the norm is computed: the first gradient's device (the CPU without any).
c10::Device norm_device(const GradGroups& groups) {
  return groups.empty() ? c10::Device(c10::kCPU) : groups.front().device;
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) grads.push_back(p.grad());
  return grads;
}

}  // namespace

double global_grad_norm(const std::vector<at::Tensor>& parameters, double norm_type,
                        Communicator* group) {
  torch::autograd::AutoGradMode no_grad(false);
  int64_t count = 0;
  const GradGroups groups = group_grads(grads_of(parameters), &count);
  const c10::Device device = norm_device(groups);
  return norm_tensor(groups, count, device, norm_type, group).item<double>();
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                      Communicator* group) {
  return clip_gradients(grads_of(parameters), max_norm, norm_type, group);
}

double clip_gradients(const std::vector<at::Tensor>& gradients, double max_norm, double norm_type,
                      Communicator* group) {
  if (!(max_norm > 0)) {
    throw ConfigError("tandem: clip_grad_norm: max_norm must be positive, got " +
                      std::to_string(max_norm) + ".");
  }
  torch::autograd::AutoGradMode no_grad(false);
  int64_t count = 0;
  const GradGroups groups = group_grads(gradients, &count);
  const c10::Device device = norm_device(groups);
  const at::Tensor norm = norm_tensor(groups, count, device, norm_type, group);
  // On the device, no read back: the factor is max_norm / (norm + 1e-6) capped at 1, and 1 for a
  // norm that is not finite (an overflow that GradScaler skips; scaling by 0 or NaN would corrupt
  // the weights of an optimizer that steps anyway).
  const at::Tensor factor =
      at::where(norm.isfinite(), at::full_like(norm, max_norm).div_(norm.add(1e-6)).clamp_max_(1.0),
                at::ones_like(norm))
          .reshape({});
  // One fused multiply per device and dtype, by the factor in the gradients' dtype (what a
  // 0-dim tensor in a multiply by it becomes).
  for (const GradGroup& g : groups) at::_foreach_mul_(g.grads, factor.to(g.device, g.dtype));
  return norm.item<double>();  // the one host read
}

}  // namespace tandem
