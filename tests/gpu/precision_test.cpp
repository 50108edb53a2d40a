// Mixed precision on a GPU at world 1 over NCCL, under DistributedDataParallel and every sharding
// stage, against the plain loop written by hand:
//  - fp16 parameters with fp32 masters, GradScaler (growing every 2 clean steps, so it overflows
//    and backs off within the run) and global-norm clipping (to 1e-3: it clips every finite step);
//  - bf16 autocast over fp32 parameters.
// The wrappers must skip the same steps and compute the same norms and parameters, bitwise: at
// world 1 a shard holds whole parameters, and ShardedDataParallel's clip takes the norm of each
// parameter's slice in the model's parameter order, the partition and order of the plain loop's
// clip_grad_norm (a norm over whole shards would round differently, and under fp16 a last-bit
// difference of the clipping factor grows into another trajectory within a few steps).
#include "tests/gpu/gpu_trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>

namespace tandem::gpu_test {
namespace {

enum class Precision { kFp16ScalerClipped, kBf16Autocast };

Recipe recipe_of(Precision p) {
  Recipe r;
  r.size = k10M;
  if (p == Precision::kFp16ScalerClipped) {
    r.param_dtype = at::kHalf;
    r.scaler = true;
    r.growth_interval = 2;
    r.clip = 1e-3;
  } else {
    r.autocast = at::kBFloat16;
  }
  return r;
}

struct Case {
  Precision precision;
  Wrapper wrapper;
};

// The test's name in ctest and gtest's output (the default prints the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.precision == Precision::kFp16ScalerClipped ? "fp16 scaler clipped " : "bf16 autocast ")
      << wrapper_name(c.wrapper);
}

class MixedPrecision : public GpuTestWithParam<Case> {};

TEST_P(MixedPrecision, SkipsClipsAndStepsAsThePlainLoopDoes) {
  const Case c = GetParam();
  const Recipe recipe = recipe_of(c.precision);
  const RunResult plain = train(recipe, Wrapper::kPlain, 1);
  const RunResult wrapped = train(recipe, c.wrapper, 1);

  if (recipe.scaler) {  // the recipe exercises what it names
    int skipped = 0;
    for (bool s : plain.stepped) skipped += s ? 0 : 1;
    EXPECT_GE(skipped, 1) << "the scale never overflowed fp16";
    EXPECT_LE(skipped, recipe.steps - 10) << "too few steps were taken";
  }
  EXPECT_EQ(wrapped.stepped, plain.stepped) << "the steps the scaler skipped differ";

  ASSERT_EQ(wrapped.norms.size(), plain.norms.size());
  int clipped = 0;
  for (size_t i = 0; i < plain.norms.size(); ++i) {
    const double a = plain.norms[i], b = wrapped.norms[i];
    if (std::isfinite(a) && a > recipe.clip) ++clipped;
    if (!std::isfinite(a) || !std::isfinite(b)) {
      EXPECT_EQ(std::isfinite(a), std::isfinite(b)) << "step " << i << ": " << a << " vs " << b;
    } else {
      EXPECT_EQ(b, a) << "step " << i;
    }
  }
  if (recipe.clip > 0) {
    EXPECT_GE(clipped, 1) << "clipping never applied";
  }

  EXPECT_EQ(difference(wrapped.masters, plain.masters), "") << wrapper_name(c.wrapper);
  EXPECT_NE(difference(initial_masters(recipe), plain.masters), "") << "nothing trained";
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (Precision p : {Precision::kFp16ScalerClipped, Precision::kBf16Autocast}) {
    for (Wrapper w : {Wrapper::kDdp, Wrapper::kZero1, Wrapper::kZero2, Wrapper::kZero3}) {
      all.push_back({p, w});
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(RecipesAndWrappers, MixedPrecision, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return std::string(c.precision == Precision::kFp16ScalerClipped
                                                  ? "fp16_scaler_clipped_"
                                                  : "bf16_autocast_") +
                                  wrapper_name(c.wrapper);
                         });

}  // namespace
}  // namespace tandem::gpu_test
