// Checkpoints of a CUDA model with AdamW under DistributedDataParallel and every sharding stage,
// saved synchronously and asynchronously (the async save copies the parameters and AdamW's state
// off the GPU while the next step's forward and backward run): a fresh model resumed from them
// holds the saved bits on the GPU, and its next step is the uninterrupted run's, bit for bit.
#include "tests/gpu/gpu_trainer.h"

#include <tandem/checkpoint/checkpoint_manager.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <unistd.h>

namespace tandem::gpu_test {
namespace {

struct Case {
  Wrapper wrapper;
  bool async;
};

// The test's name in ctest and gtest's output (the default prints the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << wrapper_name(c.wrapper) << (c.async ? " async" : " sync");
}

struct Snapshot {
  std::map<std::string, at::Tensor> masters;
  std::vector<at::Tensor> optimizer;
};

Snapshot snapshot(Trainer& t) { return {assemble({t.masters()}), adamw_state(t.optimizer())}; }

// "" when every tensor the optimizer steps, and its state, is on the GPU (the test device).
std::string off_the_gpu(Trainer& t) {
  for (const auto& p : t.optimizer().parameters()) {
    if (p.device() != test_device()) {
      return "a parameter the optimizer steps is on " + p.device().str();
    }
  }
  const auto state = adamw_state(t.optimizer());
  for (size_t i = 0; i < state.size(); ++i) {
    // Every third is the step count, a host number.
    if (i % 3 != 2 && state[i].device() != test_device()) {
      return "AdamW state tensor #" + std::to_string(i) + " is on " + state[i].device().str();
    }
  }
  return "";
}

class CheckpointRoundTrip : public GpuTestWithParam<Case> {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    char tmpl[] = "/tmp/tandem-gpu-ckpt-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  CheckpointManagerOptions options(std::shared_ptr<Communicator> world) const {
    CheckpointManagerOptions o;
    o.directory = dir_;
    o.async = GetParam().async;
    o.keep_last = 0;
    o.communicator = std::move(world);
    return o;
  }
  std::string dir_;
};

TEST_P(CheckpointRoundTrip, ResumesBitwiseOntoTheGpuAndTheNextStepIsBitwiseToo) {
  const Case c = GetParam();
  Recipe recipe;
  recipe.size = k10M;
  Distributed dist = nccl_world_of_one();
  Snapshot saved, next;
  {  // Uninterrupted: 3 steps, a save of step 3, step 4 (under an async save still copying).
    Trainer t(recipe, c.wrapper, make_net(recipe.size, 7), dist.world, 1);
    CheckpointManager ckpt(options(dist.world));
    t.register_checkpoint(ckpt);
    for (int s = 0; s < 3; ++s) t.step(s);
    saved = snapshot(t);
    ckpt.save(3);
    t.step(3);
    next = snapshot(t);
    ckpt.wait();
  }
  ASSERT_NE(difference(saved.masters, next.masters), "") << "step 4 changed nothing";
  {  // Resumed: other initial weights, then the checkpoint of step 3, then step 4 again.
    Trainer t(recipe, c.wrapper, make_net(recipe.size, 99), dist.world, 1);
    CheckpointManager ckpt(options(dist.world));
    t.register_checkpoint(ckpt);
    ASSERT_NE(difference(assemble({t.masters()}), saved.masters), "") << "nothing to restore";
    ASSERT_EQ(ckpt.resume(), 3);
    EXPECT_EQ(off_the_gpu(t), "");
    const Snapshot resumed = snapshot(t);
    EXPECT_EQ(difference(resumed.masters, saved.masters), "") << "parameters after resume";
    EXPECT_EQ(difference(resumed.optimizer, saved.optimizer), "") << "AdamW state after resume";
    t.step(3);
    const Snapshot stepped = snapshot(t);
    EXPECT_EQ(difference(stepped.masters, next.masters), "") << "parameters after the next step";
    EXPECT_EQ(difference(stepped.optimizer, next.optimizer), "") << "AdamW state after it";
  }
}

INSTANTIATE_TEST_SUITE_P(
    WrappersSyncAndAsync, CheckpointRoundTrip,
    ::testing::Values(Case{Wrapper::kDdp, false}, Case{Wrapper::kDdp, true},
                      Case{Wrapper::kZero1, false}, Case{Wrapper::kZero1, true},
                      Case{Wrapper::kZero2, false}, Case{Wrapper::kZero2, true},
                      Case{Wrapper::kZero3, false}, Case{Wrapper::kZero3, true}),
    [](const auto& info) {
      return wrapper_name(info.param.wrapper) + (info.param.async ? "_async" : "_sync");
    });

}  // namespace
}  // namespace tandem::gpu_test
