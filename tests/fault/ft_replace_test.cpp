// Step-level fault tolerance with replacement: `tandemrun --ft-replace` starts a new process for
// a SIGKILLed rank (tests/fault/ft_worker.cpp); the survivors wait for it (ft.replacement_wait_s),
// heal it from a live peer over the communicator, and the group trains on at full size. Every run
// ends bitwise equal to an uninterrupted one, with no checkpoint anywhere, and loses at most the
// step the failure happened in.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "tests/fault/ft_harness.h"

namespace tandem::launcher_test {
namespace {

struct Replaced {
  int nproc;
  int killed;
  int step;
  std::string at;
  std::vector<std::string> env;  // more fault injection (FT_HEAL_KILL)
  int replacements = 1;          // processes tandemrun starts for dead ranks
  int failures = 1;              // processes that die (each may cost the step it died in)
  int healed_receivers = 1;      // in the last heal
  std::vector<std::string> settings{};  // --set key=value (sharding)
};

RunResult run_replaced(const Replaced& t, const std::string& out) {
  std::vector<std::string> env{"FT_KILL_RANKS=" + std::to_string(t.killed),
                               "FT_KILL_STEP=" + std::to_string(t.step), "FT_KILL_AT=" + t.at};
  env.insert(env.end(), t.env.begin(), t.env.end());
  return run_worker(t.nproc, {"--ft-replace", "--max-restarts", "3"},
                    with_settings({"--out", out, "--set", "ft.enabled=true", "--set",
                                   "ft.replacement_wait_s=30"},
                                  t.settings),
                    env);
}

void expect_replaced(const Replaced& t) {
  TempDir dir("ft_replace");
  const std::string out = dir.path + "/params.bin";
  const RunResult r = run_replaced(t, out);
  ASSERT_FALSE(r.timed_out) << r.err << r.out;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("rank " + std::to_string(t.killed) +
                        " was killed by signal 9 \\(SIGKILL\\).*go on without it \\(--ft-replace\\)")))
      << r.err;
  EXPECT_NE(r.err.find("rank " + std::to_string(t.killed) + ": replacement " +
                       std::to_string(t.replacements) + " started"),
            std::string::npos)
      << r.err;
  // The standby a replacement used is restocked, so the rank's next replacement is as fast.
  if (r.err.find("replacement 1 started from its standby") != std::string::npos) {
    for (int n = 2; n <= t.replacements; ++n)
      EXPECT_NE(r.err.find("replacement " + std::to_string(n) + " started from its standby"),
                std::string::npos)
          << "the standby was not restocked\n" << r.err;
  }
  const Survivors s = parse(r.out);
  // Every rank finished, the survivors in the processes they started in.
  ASSERT_EQ(s.done_pid.size(), static_cast<std::size_t>(t.nproc)) << r.out;
  for (const auto& [rank, pid] : s.done_pid) EXPECT_EQ(s.start_pid.at(rank), pid) << r.out;
  // The step the failure happened in (after the commit: the next one) is the only one lost.
  const int lost_step = t.at == "after" ? t.step + 1 : t.step;
  EXPECT_EQ(s.since, std::set<int>{lost_step}) << r.out;
  for (int aborted : s.aborted) EXPECT_LE(aborted, t.failures) << r.out;
  EXPECT_NE(r.out.find("ft healed step " + std::to_string(lost_step) + " receivers " +
                       std::to_string(t.healed_receivers)),
            std::string::npos)
      << r.out;
  // Nobody opened a checkpoint: the heal-only manager's directory was never even created.
  EXPECT_FALSE(std::filesystem::exists(out + ".heal-only"));
  EXPECT_EQ(read_file(out), reference(t.nproc, 0, 0, kSteps, t.settings))
      << "the parameters differ from those of an uninterrupted run\n"
      << r.out;
}

// Random trials with replacement (8 in CI, FT_TEST_TRIALS=20 for the issue's run): a random rank of 2-4, at a random step and point of the
// step. FT_TEST_SEED=<n> replays a draw; the seed is in the test's output.
TEST(StepFaultToleranceReplace, RandomSigkillWithReplacementEndsBitwiseEqualToUninterrupted) {
  run_drawn_trials(", replaced", [](const Draw& d) { expect_replaced({d.nproc, d.rank, d.step, d.at, {}}); });
}

// The replacement dies as its healing begins: the survivors re-form once more, tandemrun replaces
// it again, and the second replacement heals and the run still ends as an uninterrupted one.
TEST(StepFaultToleranceReplace, ReplacementDyingWhileHealingIsReplacedAgain) {
  Replaced t{3, 1, 2, "forward", {"FT_HEAL_KILL=receiver"}};
  t.replacements = 2;
  t.failures = 2;
  expect_replaced(t);
}

// The peer that heals dies as the healing begins: the next epoch heals both the replacement (which
// never got the state) and the healer's replacement from the one member left that holds it.
TEST(StepFaultToleranceReplace, HealerDyingWhileHealingAnotherMemberHeals) {
  Replaced t{3, 1, 2, "backward", {"FT_HEAL_KILL=source"}};
  t.healed_receivers = 2;
  t.failures = 2;
  expect_replaced(t);
}

// With two ranks the healer is the only holder of the state: when it dies, no member can heal, the
// group fails with that reason and tandemrun restarts it (from scratch here: no checkpoint).
TEST(StepFaultToleranceReplace, HealerDyingWithNoOtherHolderRestartsTheGroup) {
  TempDir dir("ft_replace_restart");
  const std::string out = dir.path + "/params.bin";
  const RunResult r = run_replaced({2, 1, 3, "vote", {"FT_HEAL_KILL=source"}}, out);
  ASSERT_FALSE(r.timed_out) << r.err << r.out;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.err.find("cannot go on without a restart: tandem: no member"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting all workers"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(out), reference(2, 0, 0));
}

// Without a wait the survivors go on at once at the smaller size; the replacement is admitted at
// the start of a later step, healed, and the group ends at full size.
TEST(StepFaultToleranceReplace, LateReplacementIsAdmittedAtAStepStart) {
  TempDir dir("ft_replace_late");
  const std::string out = dir.path + "/params.bin";
  const RunResult r =
      run_worker(2, {"--ft-replace", "--max-restarts", "1"},
                 {"--out", out, "--steps", "40", "--pause-ms", "250", "--set", "ft.enabled=true"},
                 {"FT_KILL_RANKS=1", "FT_KILL_STEP=1", "FT_KILL_AT=forward",
                  "FT_REPLACEMENT_DELAY_MS=1500"});
  ASSERT_FALSE(r.timed_out) << r.err << r.out;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const Survivors s = parse(r.out);
  ASSERT_EQ(s.done_pid.size(), 2u) << r.out;
  EXPECT_EQ(s.members, std::set<std::string>{"0,1"}) << r.out;
  std::smatch healed;
  ASSERT_TRUE(std::regex_search(r.out, healed, std::regex(R"(ft healed step (\d+) receivers 1)"))) << r.out;
  EXPECT_GT(std::stoi(healed[1]), 1) << r.out;  // after steps at the smaller size
  EXPECT_EQ(s.since, std::set<int>{std::stoi(healed[1])}) << r.out;
}

// Hybrid sharding (sharding.group_size=2 of 4 ranks): the replacement heals its shards, of the
// parameters and of the momentum, from the rank at the same position in the other replica group;
// the survivors carry theirs onto the new world. The run ends bitwise equal to an uninterrupted
// one at each stage, for a rank killed before forward, mid-backward or before the vote.
struct HybridCase {
  int stage;
  int killed;
  int step;
  const char* at;
};

class StepFaultToleranceHybrid : public ::testing::TestWithParam<HybridCase> {};

TEST_P(StepFaultToleranceHybrid, AReplacementHealsItsShardsFromTheOtherReplicaGroup) {
  const HybridCase& c = GetParam();
  Replaced t{4, c.killed, c.step, c.at, {}};
  t.settings = {"sharding.stage=" + std::to_string(c.stage), "sharding.group_size=2"};
  expect_replaced(t);
}

INSTANTIATE_TEST_SUITE_P(Stages, StepFaultToleranceHybrid,
                         ::testing::Values(HybridCase{1, 3, 1, "forward"}, HybridCase{2, 1, 2, "backward"},
                                           HybridCase{3, 2, 3, "vote"}, HybridCase{3, 0, 2, "backward"}),
                         [](const auto& info) {
                           return "Stage" + std::to_string(info.param.stage) + "Rank" +
                                  std::to_string(info.param.killed) + "At" + info.param.at;
                         });

// Sharded state that no live rank holds a replica of falls back to the restart from the
// checkpoint, saying why: hybrid sharding whose lost rank nobody replaces (the survivors' shards
// no longer line up), and sharding over every rank, where a replacement has no replica to heal
// from. The restarted run resumes from its checkpoint and ends as an uninterrupted one.
struct RestartCase {
  const char* name;
  std::vector<std::string> launcher;
  std::vector<std::string> settings;
  const char* why;
};

class StepFaultToleranceShardedRestart : public ::testing::TestWithParam<RestartCase> {};

TEST_P(StepFaultToleranceShardedRestart, ShardsWithoutAReplicaRestartFromTheCheckpoint) {
  const RestartCase& c = GetParam();
  TempDir dir("ft_sharded_restart");
  const std::string out = dir.path + "/params.bin";
  std::vector<std::string> launcher = c.launcher;
  launcher.insert(launcher.end(), {"--max-restarts", "2"});  // a replacement uses one
  const RunResult r = run_worker(
      4, launcher,
      with_settings({"--out", out, "--ckpt", dir.path + "/ckpt", "--every", "2", "--set", "ft.enabled=true"},
                    c.settings),
      {"FT_KILL_RANKS=1", "FT_KILL_STEP=3", "FT_KILL_AT=forward"});
  ASSERT_FALSE(r.timed_out) << r.err << r.out;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.err.find(std::string("cannot go on without a restart: tandem: sharded state (shard "
                                   "groups of ") + c.why),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restarting all workers"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(out), reference(4, 0, 0, kSteps, c.settings));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, StepFaultToleranceShardedRestart,
    ::testing::Values(RestartCase{"HybridWithoutReplacement", {"--ft"},
                                  {"sharding.stage=2", "sharding.group_size=2"},
                                  "2 ranks, sharding.group_size) cannot go on"},
                      RestartCase{"FullShardingWithReplacement", {"--ft-replace"},
                                  {"sharding.stage=3", "ft.replacement_wait_s=30"},
                                  "4 ranks, sharding.group_size) has no live replica of shard 1"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::launcher_test
