// Activation checkpointing on a GPU with dropout: the recompute in backward replays the CUDA
// generator's state, so it draws the forward's masks, and the caller's random stream continues
// where the forward left it. Every hidden layer under a checkpoint (plain loop, DDP and stage 3
// at world 1 over NCCL) ends bitwise where the plain loop without checkpoints ends; without the
// replay the masks differ and so do the parameters (the test sees dropout act on the GPU).
#include "tests/gpu/gpu_trainer.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem::gpu_test {
namespace {

Recipe with_dropout(bool checkpointed, bool replay_rng = true) {
  Recipe r;
  r.size = k10M;
  r.steps = 10;
  r.model.dropout = 0.1;
  r.model.checkpointed = checkpointed;
  r.model.replay_rng = replay_rng;
  return r;
}

class ActivationCheckpointing : public GpuTestWithParam<Wrapper> {};

TEST_P(ActivationCheckpointing, DropoutUnderCheckpointsEndsBitwiseWhereThePlainLoopEnds) {
  const RunResult reference = train(with_dropout(false), Wrapper::kPlain, 1);
  const RunResult checkpointed = train(with_dropout(true), GetParam(), 1);
  EXPECT_EQ(difference(checkpointed.masters, reference.masters), "") << wrapper_name(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Wrappers, ActivationCheckpointing,
                         ::testing::Values(Wrapper::kPlain, Wrapper::kDdp, Wrapper::kZero3),
                         [](const auto& info) { return wrapper_name(info.param); });

class ActivationCheckpointingControl : public GpuTest {};

TEST_F(ActivationCheckpointingControl, WithoutTheRngReplayTheMasksAndTheParametersDiffer) {
  const RunResult reference = train(with_dropout(false), Wrapper::kPlain, 1);
  const RunResult loose = train(with_dropout(true, /*replay_rng=*/false), Wrapper::kPlain, 1);
  EXPECT_NE(difference(loose.masters, reference.masters), "");
}

}  // namespace
}  // namespace tandem::gpu_test
