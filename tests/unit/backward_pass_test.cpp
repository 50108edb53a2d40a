// The one backward-pass driver of both data-parallel wrappers (runtime/data_parallel/
// backward_pass.h): its state machine, and the same misuse caught, in the same words, by
// DistributedDataParallel and ShardedDataParallel. Ranks as threads over Gloo.
#include "runtime/data_parallel/backward_pass.h"
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>

namespace tandem {
namespace {

using detail::BackwardPass;

std::string error_of(const std::function<void()>& f) { return testing::message_of<Error>(f); }

TEST(BackwardPass, AnUnarmedGradientIsIgnoredAndAFailedFinalizeIsTheNextForwardsError) {
  BackwardPass pass("DistributedDataParallel");
  EXPECT_FALSE(pass.on_gradient("w", false, [] { FAIL() << "queued without a backward"; }));
  pass.arm(true);
  EXPECT_TRUE(pass.armed());
  EXPECT_EQ(pass.begin_forward(), BackwardPass::Mode::kSynchronizing);  // armed, never started
  EXPECT_EQ(pass.mode(), BackwardPass::Mode::kIdle);
  pass.arm(true);
  pass.fail("tandem: DistributedDataParallel: bucket 1 never became ready");
  EXPECT_EQ(error_of([&] { pass.begin_forward(); }),
            "tandem: DistributedDataParallel: bucket 1 never became ready");
  EXPECT_EQ(pass.begin_forward(), BackwardPass::Mode::kIdle);  // said once
  pass.arm(true);
  pass.start_without_callback();
  EXPECT_NE(error_of([&] { pass.begin_forward(); })
                .find("tandem: DistributedDataParallel: forward called while the previous backward "
                      "had not finished"),
            std::string::npos);
  pass.arm(false);
  pass.finish();
  EXPECT_EQ(pass.mode(), BackwardPass::Mode::kIdle);  // an accumulating backward finalizes to idle
}

// A second backward through one forward (retain_graph) reaches parameters whose backward is over:
// both wrappers refuse it, naming themselves and the parameter.
template <class Wrap>
void expect_second_backward_refused(const std::string& wrapper, const Wrap& wrap) {
  testing::run_ranks(2, [&](Communicator& world) {
    torch::manual_seed(0);
    auto model = torch::nn::Linear(4, 2);
    auto comm = testing::borrow(world);
    auto wrapped = wrap(model, comm);
    auto loss = (*wrapped)(torch::ones({3, 4})).sum();
    loss.backward({}, /*retain_graph=*/true);
    const std::string e = testing::message_of<std::exception>([&] { loss.backward(); });
    EXPECT_NE(e.find("tandem: " + wrapper + ": parameter '"), std::string::npos) << e;
    EXPECT_NE(e.find("received a gradient after the backward of its forward had finished: "
                     "backward ran twice through one forward (retain_graph)"),
              std::string::npos) << e;
  });
}

TEST(BackwardPass, BothWrappersRefuseASecondBackwardThroughOneForwardAlike) {
  expect_second_backward_refused("DistributedDataParallel", [](auto model, auto comm) {
    return std::make_shared<DistributedDataParallel<torch::nn::LinearImpl>>(model, comm,
                                                                            DistributedDataParallelOptions{});
  });
  expect_second_backward_refused("ShardedDataParallel", [](auto model, auto comm) {
    ShardingOptions sharding;
    sharding.stage = 2;
    return std::make_shared<ShardedDataParallel<torch::nn::LinearImpl>>(model, comm, sharding);
  });
}

}  // namespace
}  // namespace tandem
