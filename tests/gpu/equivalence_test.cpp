// DistributedDataParallel and ShardedDataParallel stages 1-3 on a GPU end bitwise where the plain
// loop ends after 30 AdamW steps, for models of 10 M and 134 M parameters and one whose widths
// are no multiple of 64 (the wrappers' flat buffers must align each parameter as a tensor of its
// own, or cuBLAS runs other kernels): at world 1 over NCCL, and at world 2 as two processes on
// the one GPU over Gloo, which stages CUDA tensors through host memory. The same kernels run on
// the same values in the same order on both sides (the world-2 average is one fp32 addition and a
// halving, exact in any order), so nothing may differ.
#include "tests/gpu/gpu_trainer.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>

namespace tandem::gpu_test {
namespace {

struct Case {
  ModelSize size;
  int world;
  Wrapper wrapper;
};

// The test's name in ctest and gtest's output (the default prints the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.size.name << " world " << c.world << " " << wrapper_name(c.wrapper);
}

class Equivalence : public GpuTestWithParam<Case> {};

TEST_P(Equivalence, ThirtyAdamWStepsEndBitwiseWhereThePlainLoopEnds) {
  const Case c = GetParam();
  Recipe recipe;
  recipe.size = c.size;
  recipe.steps = 30;
  const RunResult plain = train(recipe, Wrapper::kPlain, c.world);
  const RunResult wrapped = train(recipe, c.wrapper, c.world);
  EXPECT_EQ(wrapped.replica_difference, "") << "the ranks' replicas differ";
  EXPECT_EQ(difference(wrapped.masters, plain.masters), "")
      << wrapper_name(c.wrapper) << " at world " << c.world << ", " << c.size.name << " model";
  // The run trained: the parameters moved away from their initial values.
  EXPECT_NE(difference(initial_masters(recipe), plain.masters), "");
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const ModelSize& size : {k10M, k130M, kOdd}) {
    for (int world : {1, 2}) {
      for (Wrapper w : {Wrapper::kDdp, Wrapper::kZero1, Wrapper::kZero2, Wrapper::kZero3}) {
        all.push_back({size, world, w});
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(SizesWorldsAndWrappers, Equivalence, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return std::string(c.size.name) + "_world" + std::to_string(c.world) +
                                  "_" + wrapper_name(c.wrapper);
                         });

}  // namespace
}  // namespace tandem::gpu_test
