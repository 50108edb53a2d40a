// What reaches the flight recorder: every op a backend issues, once, numbered by Communicator's
// issue() (collectives apart from send/recv), whatever wraps the backend; nothing for an op the
// argument checks refuse; a refused op of a broken communicator ends failed, never "enqueued".
#include <tandem/base/errors.h>
#include <tandem/collectives/device_routing_communicator.h>
#include <tandem/collectives/flight_recorder.h>
#include <tandem/collectives/gloo_communicator.h>

#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>
#include <vector>

namespace tandem {
namespace {

struct FlightIssueTest : ::testing::Test {
  FlightRecorder& recorder = FlightRecorder::instance();
  void SetUp() override { recorder.reset(16, true); }
  void TearDown() override { recorder.reset(2048, true); }
};

TEST_F(FlightIssueTest, AWrappedBackendRecordsEachOpOnceInIssueOrder) {
  auto cpu = connect_gloo(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  auto other = connect_gloo(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  DeviceRoutingCommunicator routed(cpu, other);
  const at::Tensor t = at::ones({8});
  routed.allreduce(t)->wait();
  routed.barrier()->wait();
  cpu->broadcast(t, 0)->wait();
  // Refused by the base's checks before anything is numbered or recorded.
  EXPECT_THROW(routed.allreduce(at::Tensor()), CommError);
  EXPECT_THROW(cpu->broadcast(t, 3), CommError);
  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 3u);
  const std::vector<std::string> ops = {"allreduce", "barrier", "broadcast"};
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].op, ops[i]);
    EXPECT_EQ(entries[i].seq, i) << "one count per communicator, the wrapper's ops included";
    EXPECT_EQ(entries[i].backend, "gloo");
    EXPECT_EQ(entries[i].group, "[0]");
    EXPECT_FALSE(entries[i].p2p);
    EXPECT_EQ(entries[i].state, FlightRecorder::State::kCompleted);
    EXPECT_GT(entries[i].ended_s, 0);
    EXPECT_GE(entries[i].ended_s, entries[i].enqueued_s);
  }
  EXPECT_EQ(entries[0].detail, "sum, 32 B float32");
}

TEST_F(FlightIssueTest, AnOpRefusedByABrokenCommunicatorEndsFailed) {
  auto comm = connect_gloo(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  comm->abort("test: aborted on purpose");
  EXPECT_THROW(comm->allreduce(at::ones({2})), CommError);
  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].state, FlightRecorder::State::kFailed);
  EXPECT_NE(entries[0].error.find("aborted on purpose"), std::string::npos) << entries[0].error;
}

}  // namespace
}  // namespace tandem
