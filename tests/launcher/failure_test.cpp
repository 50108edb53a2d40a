// A failing worker stops the group; the summary names it; nothing is left running.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

void expect_all_gone(const std::map<int, pid_t>& pids) {
  for (const auto& [rank, pid] : pids) {
    EXPECT_TRUE(wait_until_gone(pid, 2s)) << "rank " << rank << " (pid " << pid << ") still runs";
  }
}

TEST(FailureTest, FailingWorkerStopsTheOthersAndIsNamed) {
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "3", worker_path(), "fail-rank", "1", "3", "300"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // The others die on SIGTERM at once: well under the 5 s grace period.
  EXPECT_LT(r.seconds, 4.0) << r.err;
  EXPECT_NE(r.err.find("tandemrun: worker failed: rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") exited with code 3\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tandemrun: other workers:"), std::string::npos) << r.err;
  for (int rank : {0, 2}) {
    EXPECT_NE(r.err.find("rank " + std::to_string(rank) + " (pid "), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("was killed by signal 15 (SIGTERM) after tandemrun sent SIGTERM"),
            std::string::npos)
      << r.err;
  // The failed worker's partial last line comes out before the summary.
  const auto words = r.err.find("[rank 1]: dying words\n");
  ASSERT_NE(words, std::string::npos) << r.err;
  EXPECT_LT(words, r.err.find("worker failed"));

  const auto pids = summary_pids(r.err);
  ASSERT_EQ(pids.size(), 3u) << r.err;
  expect_all_gone(pids);
}

TEST(FailureTest, WorkerKilledBySignalIsNamedWithTheSignal) {
  TandemrunProcess run({"--nproc-per-node", "2", worker_path(), "sleep"});
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 2)) << run.out() << run.err();
  const auto pids = ready_pids(run.out());
  ASSERT_EQ(pids.size(), 2u);
  ::kill(pids.at(1), SIGKILL);
  const RunResult r = run.finish(15s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("worker failed: rank 1 (pid " + std::to_string(pids.at(1)) +
                       ") was killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << r.err;
  expect_all_gone(pids);
}

TEST(FailureTest, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TandemrunProcess run(
      {"--nproc-per-node", "3", "--grace-period-s", "1", worker_path(), "ignore-term"});
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 3)) << run.out() << run.err();
  const auto pids = ready_pids(run.out());
  ASSERT_EQ(pids.size(), 3u);
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(pids.at(2), SIGKILL);
  const RunResult r = run.finish(15s);
  const double stop_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_GE(stop_seconds, 0.9) << "SIGKILL must wait for the grace period";
  EXPECT_LT(stop_seconds, 5.0) << r.err;
  for (int rank : {0, 1}) {
    EXPECT_NE(
        r.err.find(
            "rank " + std::to_string(rank) + " (pid " + std::to_string(pids.at(rank)) +
            ") was killed by signal 9 (SIGKILL) after ignoring SIGTERM for the 1 s grace period"),
        std::string::npos)
        << r.err;
  }
  expect_all_gone(pids);
}

TEST(FailureTest, AllWorkersSucceedingExitsZeroWithoutSummary) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "4", worker_path(), "env"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err.find("worker failed"), std::string::npos) << r.err;
}

TEST(FailureTest, ProcessesAWorkerLeftInItsGroupAreKilledWhenTheRunEnds) {
  // The worker (a shell) exits 0 at once, leaving a background child that still holds its output
  // pipe: tandemrun must neither wait for that pipe nor leave the child running.
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "1", "/bin/sh", "-c", "sleep 30 & echo child=$!"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  const auto pos = r.out.find("[rank 0]: child=");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const pid_t child = static_cast<pid_t>(std::stol(r.out.substr(pos + 16)));
  EXPECT_TRUE(wait_until_gone(child, 2s)) << "leftover child " << child << " still runs";
}

TEST(FailureTest, ProgramThatCannotBeExecutedFailsTheLaunch) {
  // Executable, but its interpreter does not exist: passes validation, execve() fails.
  char path[] = "/tmp/tandemrun_bad_interp_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string script = "#!/nonexistent/interpreter\n";
  ASSERT_EQ(::write(fd, script.data(), script.size()), static_cast<ssize_t>(script.size()));
  ::fchmod(fd, 0755);
  ::close(fd);
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", path});
  ::unlink(path);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot start rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("execve failed: No such file or directory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem::launcher_test
