// Bad input on a machine with a GPU (issue 26 item 7), each a ConfigError that says what is wrong
// and what to do, raised before anything runs: ranks whose models are on different device types,
// a CUDA device index this machine lacks, and a model left on the CPU while train.device is cuda.
// (A CUDA tensor where tandem has no CUDA part: no_cuda_part_test.cpp, in processes of its own.)
#include "tests/gpu/gpu_test_util.h"
#include "tests/sharded/sharded_test_util.h"
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/nccl_communicator.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/context.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <string>

namespace tandem::gpu_test {
namespace {

using sharded_test::borrow;
using sharded_test::make_net;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

class BadInput : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (!IsSkipped() && test_device().is_cpu()) GTEST_SKIP() << "needs a GPU: no CPU rehearsal";
  }
};

TEST_F(BadInput, RanksWhoseModelsAreOnDifferentDeviceTypesFailOnEveryRank) {
  GlooOptions gloo;
  gloo.timeout = std::chrono::seconds(60);  // a rank left waiting fails the test, not hangs it
  for (int stage : {-1, 1, 3}) {  // -1: DistributedDataParallel
    auto on_gpu = make_net(7);
    on_gpu->to(torch::kCUDA);
    std::vector<std::shared_ptr<sharded_test::NetImpl>> models = {on_gpu, make_net(7)};
    std::vector<std::string> errors(2);
    testing::run_ranks(2, [&](Communicator& comm) {
      errors[comm.rank()] = testing::config_error_of([&] {
        if (stage < 0) {
          DistributedDataParallel ddp(models[comm.rank()], borrow(comm));
        } else {
          ShardingOptions sharding;
          sharding.stage = stage;
          ShardedDataParallel sdp(models[comm.rank()], borrow(comm), sharding);
        }
      });
    }, gloo);
    for (int r = 0; r < 2; ++r) {
      const std::string e = lower(errors[r]);
      EXPECT_NE(e.find("rank 1"), std::string::npos) << "stage " << stage << ", rank " << r << ": " << errors[r];
      EXPECT_NE(e.find("cuda"), std::string::npos) << "stage " << stage << ", rank " << r << ": " << errors[r];
      EXPECT_NE(e.find("cpu"), std::string::npos) << "stage " << stage << ", rank " << r << ": " << errors[r];
    }
  }
}

TEST_F(BadInput, ACudaDeviceIndexOutOfRangeNamesTheDevicesThereAre) {
  const int n = static_cast<int>(torch::cuda::device_count());
  const std::string devices = std::to_string(n);
  const std::string context = testing::config_error_of([&] {
    Context ctx(load_config({{}, {}, {"train.device=cuda:" + devices}}), {"tandem_gpu_tests"});
  });
  EXPECT_NE(context.find("train.device is cuda:" + devices + ", but this machine has " + devices +
                         " CUDA device(s)"),
            std::string::npos)
      << context;
  NcclOptions nccl;
  nccl.device = n;
  const std::string connect = testing::config_error_of(
      [&] { connect_nccl(c10::make_intrusive<c10d::HashStore>(), 0, 1, nccl); });
  EXPECT_NE(connect.find("CUDA device " + devices + " does not exist (this machine has " +
                         devices + ")"),
            std::string::npos)
      << connect;
}

TEST_F(BadInput, AModelLeftOnTheCpuUnderTrainDeviceCudaIsRefusedByBothWrappers) {
  Context ctx(load_config({{}, {}, {"train.device=cuda"}}), {"tandem_gpu_tests"});
  ASSERT_EQ(ctx.device(), c10::Device(c10::kCUDA, 0));
  auto model = make_net(7);  // on the CPU
  const std::string ddp = testing::config_error_of(
      [&] { DistributedDataParallel(model, ctx.world(), ctx.config().ddp); });
  EXPECT_NE(ddp.find("DistributedDataParallel: parameter 'in.weight' is on cpu but train.device "
                     "is cuda:0"),
            std::string::npos)
      << ddp;
  ShardingOptions sharding;
  sharding.stage = 2;
  const std::string sdp = testing::config_error_of(
      [&] { ShardedDataParallel(model, ctx.world(), sharding, ctx.config().ddp); });
  EXPECT_NE(sdp.find("ShardedDataParallel: parameter 'in.weight' is on cpu but train.device is "
                     "cuda:0"),
            std::string::npos)
      << sdp;
  // Moved where train.device says, the same model trains there.
  model->to(ctx.device());
  DistributedDataParallel wrapped(model, ctx.world(), ctx.config().ddp);
  const sharded_test::Batch b = sharded_test::batch_of(0, 0);
  torch::mse_loss(wrapped(b.x.to(ctx.device())), b.y.to(ctx.device())).backward();
  EXPECT_TRUE(model->in->weight.grad().is_cuda());
}

}  // namespace
}  // namespace tandem::gpu_test
