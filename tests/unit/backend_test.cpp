// comm.backend (issue 19): CPU ops of a DeviceRoutingCommunicator go to its CPU communicator (the
// CUDA side needs a GPU: the gpu-labelled NCCL tests); asking for NCCL where there is none is a
// ConfigError that names the key.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/device_routing_communicator.h>
#include <tandem/collectives/nccl_communicator.h>
#include <tandem/runtime/init.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace tandem {
namespace {

std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

TEST(DeviceRouting, CpuOpsGoToTheCpuCommunicatorAndGroupsSplitBoth) {
  testing::run_ranks(2, [&](Communicator& comm) {
    auto other = comm.split(0, comm.rank());  // stands in for NCCL: same ranks, own op order
    DeviceRoutingCommunicator routing(borrow(comm), other);
    EXPECT_EQ(routing.backend(), comm.backend() + "+" + other->backend());
    auto t = torch::ones({4});
    auto work = routing.allreduce(t, ReduceOp::kSum);
    work->wait();
    EXPECT_TRUE(t.equal(torch::full({4}, 2.0)));
    // comm's first op after the split; the stand-in saw none.
    EXPECT_NE(work->describe().find("allreduce #"), std::string::npos) << work->describe();
    auto out = torch::empty({8});
    routing.allgather(out, torch::full({4}, static_cast<double>(comm.rank())))->wait();
    EXPECT_EQ(out[7].item<double>(), 1.0);
    routing.barrier()->wait();
    auto group = routing.split(0, comm.rank());
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->size(), 2);
  });
}

// A wrapper answers capability queries for what it wraps: the CPU side's fused narrowed
// all-reduce, which a codec above the routing communicator would otherwise never find.
TEST(DeviceRouting, ForwardsTheCpuCommunicatorsNarrowedAllreduce) {
  testing::run_ranks(2, [&](Communicator& comm) {
    ASSERT_NE(comm.narrowed_allreduce(), nullptr);
    auto other = comm.split(0, comm.rank());
    DeviceRoutingCommunicator routing(borrow(comm), other);
    NarrowedAllreduce* narrowed = routing.narrowed_allreduce();
    ASSERT_NE(narrowed, nullptr);
    auto direct = torch::full({64}, 3.0);
    auto routed = torch::full({64}, 3.0);
    WorkPtr a = comm.narrowed_allreduce()->allreduce_narrowed(direct, at::kBFloat16, 2);
    WorkPtr b = narrowed->allreduce_narrowed(routed, at::kBFloat16, 2);
    ASSERT_EQ(a == nullptr, b == nullptr);  // the same path, taken or declined alike
    if (a != nullptr) {
      a->wait();
      b->wait();
      // (3 / 2) rounds to 1.5 exactly in bfloat16: the sum of two ranks is 3.
      EXPECT_TRUE(routed.equal(torch::full({64}, 3.0))) << routed;
      EXPECT_TRUE(direct.equal(routed));
    }
  });
}

TEST(DeviceRouting, CommunicatorsOfDifferentRanksAreRefused) {
  testing::run_ranks(2, [&](Communicator& comm) {
    auto alone = comm.split(comm.rank(), 0);  // one rank each
    EXPECT_THROW(DeviceRoutingCommunicator(borrow(comm), alone), ConfigError);
  });
}

TEST(Backend, NcclWithoutADeviceIsAConfigErrorNamingTheKey) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  InitOptions o;
  o.backend = "nccl";
  try {
    init(o);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--set comm.backend=gloo"), std::string::npos) << e.what();
  }
  o.backend = "mpi";
  EXPECT_THROW(init(o), ConfigError);
  o.backend = "auto";  // no GPU: Gloo alone
  EXPECT_EQ(init(o).world->backend(), "gloo");
}

}  // namespace
}  // namespace tandem
