// train.device (docs/config.md): the key's values, how Context resolves it on a machine with and
// without CUDA devices, and the wrappers refusing a model that is not there.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/context.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace tandem {
namespace {

TEST(TrainDevice, TheKeyTakesAutoCpuCudaAndAnIndexAndNamesTheClosestOtherwise) {
  EXPECT_EQ(load_config({{}, {}, {"train.device=cuda:1"}}).config.train.device, "cuda:1");
  EXPECT_EQ(load_config({}).config.train.device, "auto");
  try {
    load_config({{}, {}, {"train.device=gpu"}});
    FAIL() << "train.device=gpu was accepted";
  } catch (const InvalidConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_config({{}, {}, {"train.device=cuda:-1"}}), InvalidConfigError);
}

TEST(TrainDevice, AutoIsTheRanksGpuWhenThereIsOneElseTheCpu) {
  EXPECT_EQ(resolve_train_device("auto", 3, 0), c10::Device(c10::kCPU));
  EXPECT_EQ(resolve_train_device("cpu", 0, 8), c10::Device(c10::kCPU));
  EXPECT_EQ(resolve_train_device("auto", 3, 2), c10::Device(c10::kCUDA, 1));  // LOCAL_RANK % 2
  EXPECT_EQ(resolve_train_device("cuda", 1, 4), c10::Device(c10::kCUDA, 1));
  EXPECT_EQ(resolve_train_device("cuda:2", 0, 4), c10::Device(c10::kCUDA, 2));
}

TEST(TrainDevice, ACudaDeviceThisMachineLacksIsAConfigErrorThatSaysWhatToSet) {
  const std::string none = testing::config_error_of([] { resolve_train_device("cuda", 0, 0); });
  EXPECT_NE(none.find("no usable CUDA device"), std::string::npos) << none;
  EXPECT_NE(none.find("--set train.device=cpu"), std::string::npos) << none;
  const std::string range = testing::config_error_of([] { resolve_train_device("cuda:5", 0, 1); });
  EXPECT_NE(range.find("train.device is cuda:5, but this machine has 1 CUDA device(s)"),
            std::string::npos)
      << range;
  EXPECT_NE(range.find("--set train.device=cuda"), std::string::npos) << range;
}

// A model left on the CPU while train.device says cuda: both wrappers refuse it by name before
// any collective (a CUDA device object needs no GPU, so this runs everywhere).
TEST(TrainDevice, BothWrappersRefuseAModelThatIsNotOnTrainDevice) {
  torch::manual_seed(0);
  auto model = torch::nn::Linear(4, 2);
  DistributedDataParallelOptions options;
  options.device = c10::Device(c10::kCUDA, 0);
  testing::run_ranks(1, [&](Communicator& comm) {
    std::shared_ptr<Communicator> world(&comm, [](Communicator*) {});
    const std::string ddp = testing::config_error_of([&] { DistributedDataParallel(model, world, options); });
    EXPECT_NE(ddp.find("parameter 'weight' is on cpu but train.device is cuda:0"),
              std::string::npos)
        << ddp;
    EXPECT_NE(ddp.find("--set train.device=cpu"), std::string::npos) << ddp;
    ShardingOptions sharding;
    sharding.stage = 2;
    const std::string sdp =
        testing::config_error_of([&] { ShardedDataParallel(model, world, sharding, options); });
    EXPECT_NE(sdp.find("ShardedDataParallel: parameter 'weight' is on cpu"), std::string::npos)
        << sdp;
  });
}

}  // namespace
}  // namespace tandem
