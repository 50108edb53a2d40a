// Step-level fault tolerance through `tandemrun --ft` with real training workers
// (tests/fault/ft_worker.cpp): a rank is SIGKILLed at a random step and point of the step; the
// survivors drop that one step, re-form at the smaller world size, never restart (same pids) and
// end bitwise equal to the deterministic result of the failure schedule: an uninterrupted run at
// the full size up to the switch step, checkpointed, resumed at the smaller size.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/fault/ft_harness.h"

namespace tandem::launcher_test {
namespace {

struct Trial {
  int nproc;
  std::vector<int> killed;
  int step;
  std::string at;
  bool hang = false;  // SIGSTOP instead of SIGKILL, found by tandemrun's heartbeat timeout
};

void run_trial(const Trial& t) {
  TempDir dir("ft_trial");
  const std::string out = dir.path + "/params.bin";
  std::string ranks;
  for (int r : t.killed) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  std::vector<std::string> launcher_args{"--ft"};
  if (t.hang) launcher_args.insert(launcher_args.end(), {"--heartbeat-timeout", "2"});
  const RunResult r =
      run_worker(t.nproc, launcher_args, {"--out", out, "--set", "ft.enabled=true"},
                 {"FT_KILL_RANKS=" + ranks, "FT_KILL_STEP=" + std::to_string(t.step),
                  "FT_KILL_AT=" + t.at, std::string("FT_KILL_SIGNAL=") + (t.hang ? "STOP" : "KILL")});
  ASSERT_FALSE(r.timed_out) << r.err << r.out;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
  for (int k : t.killed) {
    const std::string what = t.hang ? "sent no heartbeat for" : "was killed by signal 9 \\(SIGKILL\\)";
    EXPECT_TRUE(std::regex_search(
        r.err, std::regex("rank " + std::to_string(k) + " " + what +
                          ".*; the other workers drop the step and go on without it \\(--ft\\)")))
        << r.err;
  }
  const Survivors s = parse(r.out);
  const int lost = static_cast<int>(t.killed.size());
  // Every survivor finished in the process it started in: none restarted, none read a checkpoint
  // (the run has none).
  ASSERT_EQ(s.done_pid.size(), static_cast<std::size_t>(t.nproc - lost)) << r.out;
  for (const auto& [rank, pid] : s.done_pid) EXPECT_EQ(s.start_pid.at(rank), pid) << r.out;
  // One step lost per failure event: the step it happened in, or, after the commit, the next.
  const int expected_switch = t.at == "after" ? t.step + 1 : t.step;
  EXPECT_EQ(s.since, std::set<int>{expected_switch}) << r.out;
  EXPECT_EQ(s.aborted, std::set<int>{1}) << r.out;
  ASSERT_EQ(s.members.size(), 1u) << r.out;
  EXPECT_EQ(read_file(out), reference(t.nproc, lost, expected_switch))
      << "the survivors' parameters differ from the run with the same failure schedule\n"
      << r.out;
}

// Random trials (8 in CI, FT_TEST_TRIALS=20 for the run): a random rank of 2-4, at a
// random step, at each point of the step in turn.
// FT_TEST_SEED=<n> replays a draw; the seed is in the test's output.
TEST(StepFaultTolerance, RandomSigkillCostsOneStepAndMatchesTheFailureSchedule) {
  run_drawn_trials("", [](const Draw& d) { run_trial({d.nproc, {d.rank}, d.step, d.at}); });
}

// The comparison can fail: the reference tells failure schedules apart, to the bit (the math is
// the same mean over the step's 12 samples at every size; only the rounding differs).
TEST(StepFaultTolerance, ReferencesOfDifferentSchedulesDiffer) {
  const std::string none = reference(3, 0, 0), at2 = reference(3, 1, 2), at4 = reference(3, 1, 4);
  EXPECT_FALSE(none.empty());
  EXPECT_NE(none, at2);
  EXPECT_NE(at2, at4);
  EXPECT_NE(none, at4);
}

// Two ranks die in the same step: one abort, one new epoch without both.
TEST(StepFaultTolerance, TwoRanksDyingAtOnceCostOneStep) {
  run_trial({4, {1, 2}, 3, "backward"});
}

// A rank that hangs (SIGSTOP) while the others wait for it in the step's all-reduce: tandemrun's
// heartbeat timeout fails only that one (the others are silent because they wait for it),
// SIGKILLs and reports it, and the others go on without it.
TEST(StepFaultTolerance, HungRankIsKilledAndTheOthersGoOn) {
  Trial t{3, {1}, 2, "forward"};
  t.hang = true;
  run_trial(t);
}

// Checkpoints stay: the survivors save on their new world, and a run resumed from the newest
// checkpoint at their size ends where they ended.
TEST(StepFaultTolerance, CheckpointsAfterAShrinkStayValid) {
  TempDir dir("ft_ckpt");
  const std::string out = dir.path + "/ft.bin", resumed = dir.path + "/resumed.bin";
  const std::string ckpt = dir.path + "/ckpt";
  const RunResult r = run_worker(
      3, {"--ft"}, {"--out", out, "--ckpt", ckpt, "--every", "3", "--set", "ft.enabled=true"},
      {"FT_KILL_RANKS=2", "FT_KILL_STEP=2", "FT_KILL_AT=backward"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("ft aborted step 2 epoch 1 members 0,1"), std::string::npos) << r.out;
  const RunResult again = run_worker(2, {}, {"--out", resumed, "--ckpt", ckpt});
  ASSERT_EQ(again.exit_code, 0) << again.err << again.out;
  EXPECT_NE(again.out.find("ft done"), std::string::npos);
  EXPECT_EQ(read_file(resumed), read_file(out));
  EXPECT_EQ(read_file(out), reference(3, 1, 2));
}

// Fewer survivors than ft.min_replicas: they fail, and tandemrun restarts the group as without
// --ft (here from scratch: the run has no checkpoint); the restarted run ends as an uninterrupted
// one.
TEST(StepFaultTolerance, BelowMinReplicasTheGroupRestarts) {
  TempDir dir("ft_min");
  const std::string out = dir.path + "/params.bin";
  const RunResult r = run_worker(
      3, {"--ft", "--max-restarts", "1"},
      {"--out", out, "--set", "ft.enabled=true", "--set", "ft.min_replicas=3"},
      {"FT_KILL_RANKS=1", "FT_KILL_STEP=2", "FT_KILL_AT=forward"});
  ASSERT_FALSE(r.timed_out) << r.err << r.out;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.err.find("fewer than ft.min_replicas = 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting all workers (restart 1 of at most 1)"), std::string::npos)
      << r.err;
  EXPECT_EQ(read_file(out), reference(3, 0, 0));
}

}  // namespace
}  // namespace tandem::launcher_test
