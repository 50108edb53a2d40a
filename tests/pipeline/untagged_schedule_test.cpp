// Schedules as a backend without message tags (NCCL) runs them (issue 37): every built-in
// schedule, lowered by lower_untagged(), runs as batches of consecutive SEND/RECV actions without
// deadlock and with each pair's messages in one order on both sides; lower()'s placement of
// interleaved 1F1B (a receive right before its consumer, fine with tags) deadlocks there, and a
// pair whose two sides order their messages differently is refused. No torch.
#include <gtest/gtest.h>
#include <tandem/runtime/pipeline_schedule.h>

#include <string>

namespace tandem::pipeline {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(UntaggedSchedule, EveryBuiltInScheduleRunsAsBatches) {
  int built = 0;
  for (int p = 2; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      for (const std::string name : {"gpipe", "1f1b", "zbh1", "interleaved"}) {
        for (int v = 1; v <= (name == "interleaved" ? 3 : 1); ++v) {
          Schedule s;
          try {
            s = build_schedule(name, p, m, v);
          } catch (const ConfigError&) {
            continue;  // a shape the builder refuses (schedule_test.cpp covers which)
          }
          ++built;
          EXPECT_NO_THROW(validate_untagged(s)) << name << " p=" << p << " m=" << m << " v=" << v;
          EXPECT_NO_THROW(validate(lower_untagged(s))) << "with tags too";
        }
      }
    }
  }
  EXPECT_GT(built, 60);
}

TEST(UntaggedSchedule, BatchesAreTheRunsOfConsecutiveSendsAndReceives) {
  const Schedule s = lower_untagged(one_f_one_b(2, 4));
  const auto batches = untagged_batches(s);
  ASSERT_EQ(batches.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    for (const auto& batch : batches[r]) {
      for (size_t i = 0; i < batch.size(); ++i) {
        EXPECT_TRUE(is_comm(s.actions[r][batch[i]].op));
        if (i > 0) {
          EXPECT_EQ(batch[i], batch[i - 1] + 1);
        }
      }
      if (batch.front() > 0) {
        EXPECT_FALSE(is_comm(s.actions[r][batch.front() - 1].op));
      }
    }
  }
  // The steady state pairs a send with the receive after it: rank 0's SEND_F with its RECV_B.
  bool paired = false;
  for (const auto& batch : batches[0]) paired = paired || batch.size() == 2;
  EXPECT_TRUE(paired);
}

// lower() puts a receive right before its consumer: with tags any order of posts works. Without
// them interleaved 1F1B deadlocks: rank 0's lone SEND_B waits for a receive rank 1 queued behind
// its own send, whose receive rank 0 queued behind that SEND_B.
TEST(UntaggedSchedule, TheTaggedPlacementOfInterleaved1F1BDeadlocksWithoutTags) {
  const Schedule tagged = lower(interleaved_1f1b(2, 4, 2));
  EXPECT_NO_THROW(validate(tagged)) << "with tags this order is fine";
  try {
    validate_untagged(tagged);
    FAIL() << "no deadlock found";
  } catch (const ScheduleError& e) {
    EXPECT_TRUE(contains(e.what(), "deadlock")) << e.what();
    EXPECT_TRUE(contains(e.what(), "lower_untagged()")) << e.what();
  }
  EXPECT_NO_THROW(validate_untagged(lower_untagged(interleaved_1f1b(2, 4, 2))));
}

// Two activations from rank 0 to rank 1, received in the other order: fine with tags, wrong data
// without them.
TEST(UntaggedSchedule, APairsMessagesInTwoOrdersAreRefused) {
  Schedule s = lower(gpipe(2, 2));
  auto& recv = s.actions[1];
  int first = -1, second = -1;
  for (int j = 0; j < static_cast<int>(recv.size()); ++j) {
    if (recv[j].op != Op::kRecvForward) continue;
    (first < 0 ? first : second) = j;
  }
  ASSERT_GE(second, 0);
  // RF0:0 F1:0 RF0:1 F1:1 -> RF0:0 RF0:1 F1:0 F1:1 -> RF0:1 RF0:0 F1:0 F1:1
  std::vector<Action> reordered = {recv[second], recv[first]};
  for (int j = 0; j < static_cast<int>(recv.size()); ++j) {
    if (j != first && j != second) reordered.push_back(recv[j]);
  }
  recv = reordered;
  EXPECT_NO_THROW(validate(s));
  try {
    validate_untagged(s);
    FAIL() << "the order mismatch was not found";
  } catch (const ScheduleError& e) {
    EXPECT_TRUE(contains(e.what(), "same order on both sides")) << e.what();
  }
}

}  // namespace
}  // namespace tandem::pipeline
