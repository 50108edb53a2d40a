// Signals to tandemrun: SIGTERM/SIGINT are forwarded; SIGKILL leaves no worker behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>

#include <filesystem>
#include <ostream>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

struct ForwardCase {
  int signo;
  const char* name;
};

void PrintTo(const ForwardCase& c, std::ostream* os) { *os << c.name; }

class SignalForwarding : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(SignalForwarding, IsForwardedToEveryWorkerAndExitCodeIs128PlusSignal) {
  const ForwardCase c = GetParam();
  TandemrunProcess run({"--nproc-per-node", "2", worker_path(), "handle-term"});
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 2)) << run.out() << run.err();
  const auto pids = ready_pids(run.out());
  run.send(c.signo);
  const RunResult r = run.finish(15s);
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 128 + c.signo) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "]: rank " + std::to_string(rank) +
                         " got signal " + std::to_string(c.signo) + "\n"),
              std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.err.find(std::string("received ") + c.name), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::string("exited with code 0 after tandemrun sent ") + c.name),
            std::string::npos)
      << r.err;
  for (const auto& [rank, pid] : pids) EXPECT_TRUE(wait_until_gone(pid, 2s)) << "rank " << rank;
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalForwarding,
                         ::testing::Values(ForwardCase{SIGTERM, "SIGTERM"},
                                           ForwardCase{SIGINT, "SIGINT"}),
                         [](const ::testing::TestParamInfo<ForwardCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(SignalTest, SigtermWithWorkersIgnoringItEndsAfterTheGracePeriod) {
  TandemrunProcess run(
      {"--nproc-per-node", "2", "--grace-period-s", "1", worker_path(), "ignore-term"});
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 2)) << run.out() << run.err();
  const auto pids = ready_pids(run.out());
  run.send(SIGTERM);
  const RunResult r = run.finish(15s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(count_occurrences(r.err, "was killed by signal 9 (SIGKILL) after ignoring SIGTERM"), 2u)
      << r.err;
  for (const auto& [rank, pid] : pids) EXPECT_TRUE(wait_until_gone(pid, 2s)) << "rank " << rank;
}

TEST(SignalTest, SecondSignalSkipsTheGracePeriod) {
  TandemrunProcess run(
      {"--nproc-per-node", "2", "--grace-period-s", "20", worker_path(), "ignore-term"});
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 2)) << run.out() << run.err();
  run.send(SIGTERM);
  ASSERT_TRUE(
      run.read_until([&] { return run.err().find("received SIGTERM") != std::string::npos; }, 5s));
  run.send(SIGINT);
  const RunResult r = run.finish(10s);  // well below the 20 s grace period
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_NE(r.err.find("received SIGINT while stopping the workers; killing them now"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(
      count_occurrences(r.err, "then SIGKILL when a second signal cut the grace period short"), 2u)
      << r.err;
}

TEST(SignalTest, SigkillOfTandemrunLeavesNoWorkerBehind) {
  // Orphaned workers are re-parented to us (not to init), so we can see and reap them.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // A SIGKILLed tandemrun cannot remove its per-run directory: keep it in a directory of ours.
  char tmp[] = "/tmp/tandemrun_test_XXXXXX";
  ASSERT_NE(::mkdtemp(tmp), nullptr);
  std::vector<std::string> env = clean_env();
  env.push_back(std::string("TMPDIR=") + tmp);
  TandemrunProcess run({"--nproc-per-node", "3", worker_path(), "sleep"}, env);
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 3)) << run.out() << run.err();
  const auto pids = ready_pids(run.out());
  ASSERT_EQ(pids.size(), 3u);
  run.send(SIGKILL);
  const RunResult r = run.finish(10s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.term_signal, SIGKILL);
  for (const auto& [rank, pid] : pids) {
    EXPECT_TRUE(wait_until_gone(pid, 5s))
        << "rank " << rank << " (pid " << pid << ") survived its launcher";
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  std::error_code ignored;
  std::filesystem::remove_all(tmp, ignored);
}

}  // namespace
}  // namespace tandem::launcher_test
