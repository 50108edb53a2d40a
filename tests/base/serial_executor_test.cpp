#include "base/serial_executor.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tandem {
namespace {

TEST(SerialExecutor, RunsTasksInSubmissionOrderOnOneNamedThread) {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::string name;
  {
    SerialExecutor executor("tandem-test-ex");
    for (int i = 0; i < 100; ++i) {
      executor.submit([&, i] {
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
        if (i == 0) {
          char buf[16] = {};
          pthread_getname_np(pthread_self(), buf, sizeof(buf));
          name = buf;
        }
      });
    }
    executor.drain();
    EXPECT_EQ(executor.pending(), 0u);
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const auto& t : threads) EXPECT_EQ(t, threads[0]);
  EXPECT_NE(threads[0], std::this_thread::get_id());
  EXPECT_EQ(name, "tandem-test-ex");
}

TEST(SerialExecutor, DestructorRunsWhatIsQueuedBeforeJoining) {
  std::atomic<int> ran{0};
  {
    SerialExecutor executor("tandem-test");
    for (int i = 0; i < 50; ++i) executor.submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(SerialExecutor, AnEscapedExceptionIsRethrownOnceByDrainAndLaterTasksStillRun) {
  SerialExecutor executor("tandem-test");
  std::atomic<int> ran{0};
  executor.submit([] { throw std::runtime_error("task failed"); });
  executor.submit([&] { ++ran; });
  try {
    executor.drain();
    FAIL() << "drain() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task failed");
  }
  EXPECT_EQ(ran.load(), 1);
  EXPECT_NO_THROW(executor.drain());
}

TEST(SerialExecutor, ConcurrentSubmittersEachKeepTheirOrder) {
  SerialExecutor executor("tandem-test");
  std::vector<int> seen[4];
  std::vector<std::thread> submitters;
  for (int t = 0; t < 4; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) executor.submit([&, t, i] { seen[t].push_back(i); });
    });
  }
  for (auto& s : submitters) s.join();
  executor.drain();
  for (int t = 0; t < 4; ++t) {
    ASSERT_EQ(seen[t].size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(seen[t][i], i);
  }
}

}  // namespace
}  // namespace tandem
