// Step-level fault tolerance through `tandemrun --ft` with real training workers
// (tests/fault/ft_worker.cpp): a rank is SIGKILLed at a random step and point of the step; the
// survivors drop that one step, re-form at the smaller world size, never restart (same pids) and
// end bitwise equal to the deterministic result of the failure schedule: an uninterrupted run at
// the full size up to the switch step, checkpointed, resumed at the smaller size.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

constexpr int kSteps = 6;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> worker_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env = clean_env();
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

RunResult run_worker(int nproc, const std::vector<std::string>& launcher_args,
                     const std::vector<std::string>& worker_args,
                     const std::vector<std::string>& env = {}) {
  std::vector<std::string> args{"--standalone", "--nproc-per-node", std::to_string(nproc)};
  args.insert(args.end(), launcher_args.begin(), launcher_args.end());
  args.push_back(worker_path());
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return run_tandemrun(args, worker_env(env), 60s);
}

// Parameters of the run whose first `switch_step` steps train on `nproc` ranks and the rest on
// `nproc - lost`, through a checkpoint at the switch (none when it is 0). Cached per shape.
std::string reference(int nproc, int lost, int switch_step) {
  static std::map<std::tuple<int, int, int>, std::string> cache;
  const auto key = std::make_tuple(nproc, lost, switch_step);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  TempDir dir("ft_reference");
  const std::string out = dir.path + "/params.bin", ckpt = dir.path + "/ckpt";
  if (switch_step > 0) {
    const RunResult first = run_worker(
        nproc, {}, {"--out", out, "--ckpt", ckpt, "--save-at", std::to_string(switch_step)});
    EXPECT_EQ(first.exit_code, 0) << first.err << first.out;
  }
  const RunResult second = run_worker(nproc - lost, {}, {"--out", out, "--ckpt", ckpt});
  EXPECT_EQ(second.exit_code, 0) << second.err << second.out;
  return cache[key] = read_file(out);
}

struct Survivors {
  std::map<int, int> start_pid;  // launch rank -> pid at start
  std::map<int, int> done_pid;
  std::set<int> since;           // the first step of each survivor's final epoch
  std::set<int> aborted;         // steps aborted per survivor
  std::set<std::string> members;
};

Survivors parse(const std::string& out) {
  Survivors s;
  static const std::regex start(R"(ft start pid (\d+) rank (\d+))");
  static const std::regex done(
      R"(ft done pid (\d+) rank (\d+) epoch \d+ since (\d+) aborted (\d+) members ([\d,]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), start), end; it != end; ++it)
    s.start_pid[std::stoi((*it)[2])] = std::stoi((*it)[1]);
  for (std::sregex_iterator it(out.begin(), out.end(), done), end; it != end; ++it) {
    s.done_pid[std::stoi((*it)[2])] = std::stoi((*it)[1]);
    s.since.insert(std::stoi((*it)[3]));
    s.aborted.insert(std::stoi((*it)[4]));
    s.members.insert((*it)[5]);
  }
  return s;
}

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

// The issue's 20 trials: a random rank of 2-4, at a random step and point of the step.
// FT_TEST_SEED=<n> replays a draw; the seed is in the test's output.
TEST(StepFaultTolerance, RandomSigkillCostsOneStepAndMatchesTheFailureSchedule) {
  const char* replay = std::getenv("FT_TEST_SEED");
  const unsigned seed = replay != nullptr ? static_cast<unsigned>(std::strtoul(replay, nullptr, 10))
                                          : std::random_device{}();
  std::printf("FT_TEST_SEED=%u\n", seed);
  RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  const std::vector<std::string> points{"forward", "backward", "vote", "after"};
  for (int trial = 0; trial < 20; ++trial) {
    Trial t;
    t.nproc = 2 + static_cast<int>(rng() % 3);
    t.killed = {static_cast<int>(rng() % static_cast<unsigned>(t.nproc))};
    t.at = points[rng() % points.size()];
    // After the commit of the last step nobody notices a death: the run ends at the full size.
    t.step = static_cast<int>(rng() % static_cast<unsigned>(t.at == "after" ? kSteps - 1 : kSteps));
    const std::string what = "FT_TEST_SEED=" + std::to_string(seed) + " trial " +
                             std::to_string(trial) + ": " + std::to_string(t.nproc) +
                             " ranks, SIGKILL rank " + std::to_string(t.killed[0]) + " at step " +
                             std::to_string(t.step) + " (" + t.at + ")";
    std::printf("%s\n", what.c_str());
    std::fflush(stdout);
    SCOPED_TRACE(what);
    run_trial(t);
    if (::testing::Test::HasFatalFailure()) return;
  }
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
