// clip_grad_norm's cost (issue 37): one fused pass over the gradients, no transient the size of a
// gradient (it converted each gradient to float64, then took |g| and |g|^2 of that copy), and the
// norm within float32 rounding of a float64 reference for every norm type.
#include <tandem/memory/cpu_allocator.h>
#include <tandem/runtime/grad_norm.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

namespace tandem {
namespace {

std::vector<at::Tensor> parameters_with_gradients(int count, int64_t numel, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> params;
  for (int i = 0; i < count; ++i) {
    at::Tensor p = torch::zeros({numel}, torch::requires_grad());
    p.mutable_grad() = torch::randn({numel}) * (i + 1);
    params.push_back(p);
  }
  return params;
}

TEST(GradNorm, ClippingAllocatesNothingTheSizeOfAGradient) {
  at::set_num_threads(1);
  constexpr int64_t kNumel = int64_t{1} << 20;  // 4 MiB of float32 per gradient
  const auto params = parameters_with_gradients(6, kNumel, 3);
  auto stack = memory::install_host_cpu_allocator({}, 50);
  ASSERT_NE(stack, nullptr);
  const int64_t before = stack->stats().allocated_bytes.current;
  stack->reset_peak();
  const double norm = clip_grad_norm(params, 1.0);
  const int64_t transient = stack->stats().allocated_bytes.peak - before;
  memory::uninstall_cpu_allocator();
  EXPECT_GT(norm, 1.0);
  // A float64 copy of one gradient alone would be 8 MiB.
  EXPECT_LT(transient, 64 << 10) << "clip_grad_norm allocated " << transient << " bytes at its peak";
}

// The reference: |g|^p summed in float64 element by element.
double reference_norm(const std::vector<at::Tensor>& params, double p) {
  if (std::isinf(p)) {
    double m = 0;
    for (const auto& t : params) m = std::max(m, t.grad().to(at::kDouble).abs().max().item<double>());
    return m;
  }
  double sum = 0;
  for (const auto& t : params) sum += t.grad().to(at::kDouble).abs().pow(p).sum().item<double>();
  return std::pow(sum, 1.0 / p);
}

TEST(GradNorm, EveryNormTypeIsTheFloat64NormWithinFloat32Rounding) {
  auto params = parameters_with_gradients(5, 100003, 11);
  params[2].mutable_grad() = params[2].grad().to(at::kHalf);  // a second dtype: a second group
  for (double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    const double want = reference_norm(params, p);
    // float32 accumulation of 1e5 terms: a tree reduction's error grows with log2(n), each level
    // at most 2^-24 relative; 2^-24 * 17 levels * a safety factor of 4 < 5e-6.
    EXPECT_NEAR(global_grad_norm(params, p), want, want * 5e-6) << "norm type " << p;
  }
}

TEST(GradNorm, ClippingScalesEveryGradientByOneFactorInItsDtype) {
  auto params = parameters_with_gradients(3, 1000, 5);
  params[1].mutable_grad() = params[1].grad().to(at::kHalf);
  std::vector<at::Tensor> before;
  for (const auto& p : params) before.push_back(p.grad().clone());
  const double norm = clip_grad_norm(params, 0.5);
  const double factor = 0.5 / (norm + 1e-6);
  for (size_t i = 0; i < params.size(); ++i) {
    // What grad.mul_(factor) gives: the factor rounded to the gradient's dtype, then multiplied.
    const at::Tensor want = before[i].mul(at::scalar_tensor(factor, at::kDouble).to(before[i].scalar_type()));
    EXPECT_TRUE(params[i].grad().equal(want)) << "parameter " << i;
  }
}

}  // namespace
}  // namespace tandem
