// Mixed precision with ranks as real processes under tandemrun (precision_worker), world sizes
// 1-3, under DistributedDataParallel and every sharding stage:
//  - an fp16 run that overflows (a huge initial scale, then one rank's input blown up): every
//    rank skips exactly the same steps, the scale backs off, the masters end bitwise equal;
//  - Join: ranks with 10 and 13 batches finish, the joined ranks shadow the rest, the masters
//    agree bitwise;
//  - a bf16 run resumed from a checkpoint ends bit for bit where the uninterrupted one does.
#include "tests/launcher/tandemrun_process.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace tandem {
namespace {

using launcher_test::clean_env;
using launcher_test::RunResult;
using namespace std::chrono_literals;

using launcher_test::TempDir;

RunResult run_worker(int world, std::vector<std::string> args) {
  std::vector<std::string> full = {"--standalone", "--nproc-per-node", std::to_string(world),
                                   launcher_test::worker_path()};
  full.insert(full.end(), args.begin(), args.end());
  return launcher_test::run_tandemrun(full, clean_env(), 120s);
}

struct Report {
  std::map<int, std::map<int, std::pair<int, double>>> steps;  // rank -> step -> (stepped, scale)
  std::map<int, std::string> checksum;                         // rank -> CHECKSUM
  std::map<int, long> shadowed;                                // rank -> SHADOWED
};

Report parse(const RunResult& r) {
  Report report;
  for (const auto& line : launcher_test::split_lines(r.out)) {
    int prefix = -1, rank = -1, step = -1, stepped = 0;
    double scale = 0;
    long n = 0;
    char hex[32] = {0};
    if (std::sscanf(line.c_str(), "[rank %d]: STEP %d %d %d %lf", &prefix, &rank, &step, &stepped, &scale) == 5) {
      report.steps[rank][step] = {stepped, scale};
    } else if (std::sscanf(line.c_str(), "[rank %d]: CHECKSUM %d %31s", &prefix, &rank, hex) == 3) {
      report.checksum[rank] = hex;
    } else if (std::sscanf(line.c_str(), "[rank %d]: SHADOWED %d %ld", &prefix, &rank, &n) == 3) {
      report.shadowed[rank] = n;
    }
  }
  return report;
}

void expect_same_masters(const Report& report, int world, const RunResult& r) {
  ASSERT_EQ(static_cast<int>(report.checksum.size()), world) << r.out << r.err;
  for (const auto& [rank, sum] : report.checksum) {
    EXPECT_EQ(sum, report.checksum.at(0)) << "rank " << rank << " ended with other masters";
  }
}

// (world, stage)
class PrecisionProcesses : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  std::vector<std::string> args(std::vector<std::string> extra) const {
    std::vector<std::string> a = {"--set", "sharding.stage=" + std::to_string(std::get<1>(GetParam()))};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  int world() const { return std::get<0>(GetParam()); }
};

TEST_P(PrecisionProcesses, Fp16OverflowSkipsTheSameStepsOnEveryRank) {
  const int hot = world() - 1;  // the last rank's input is blown up at step 2
  const RunResult r = run_worker(world(), args({"--mode", "overflow", "--hot-rank", std::to_string(hot),
                                                "--set", "precision.param_dtype=fp16", "--set",
                                                "precision.scaler.init_scale=1e12", "--set",
                                                "precision.scaler.growth_interval=3", "--set", "train.steps=40"}));
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.out << r.err;
  const Report report = parse(r);
  ASSERT_EQ(static_cast<int>(report.steps.size()), world()) << r.out;
  const auto& reference = report.steps.at(0);
  ASSERT_EQ(reference.size(), 40u) << r.out;
  for (const auto& [rank, steps] : report.steps) {
    EXPECT_EQ(steps, reference) << "rank " << rank << " skipped other steps or kept another scale";
  }
  int skipped = 0;
  for (const auto& [step, entry] : reference) skipped += entry.first == 0;
  EXPECT_FALSE(reference.at(0).first) << "a scale of 1e12 must overflow fp16 at once";
  EXPECT_LT(reference.at(0).second, 1e12) << "the scale did not back off";
  EXPECT_GT(skipped, 5);
  EXPECT_LT(skipped, 40) << "never recovered";
  EXPECT_TRUE(reference.rbegin()->second.first) << "still overflowing at the end";
  expect_same_masters(report, world(), r);
}

TEST_P(PrecisionProcesses, JoinedRanksShadowTheRestAndTheMastersAgree) {
  const RunResult r = run_worker(world(), args({"--mode", "join", "--set", "precision.param_dtype=bf16"}));
  ASSERT_TRUE(r.exited && r.exit_code == 0) << "hung or failed\n" << r.out << r.err;
  const Report report = parse(r);
  for (int rank = 0; rank < world(); ++rank) {
    const long mine = rank % 2 == 1 ? 13 : 10;
    const long longest = world() > 1 ? 13 : 10;
    EXPECT_EQ(static_cast<long>(report.steps.at(rank).size()), mine) << r.out;
    EXPECT_EQ(report.shadowed.at(rank), longest - mine) << "rank " << rank;
  }
  expect_same_masters(report, world(), r);
}

TEST_P(PrecisionProcesses, Bf16RunResumedFromACheckpointEndsBitForBit) {
  TempDir straight_dir("precision"), resumed_dir("precision");
  const auto run = [&](const std::string& dir, int steps) {
    return run_worker(world(), args({"--mode", "resume", "--set", "precision.param_dtype=bf16", "--set",
                                     "precision.scaler.enabled=true", "--set", "train.steps=" + std::to_string(steps),
                                     "--set", "checkpoint.directory=" + dir, "--set", "checkpoint.every_n_steps=4"}));
  };
  const RunResult straight = run(straight_dir.path, 8);
  ASSERT_TRUE(straight.exited && straight.exit_code == 0) << straight.out << straight.err;
  const RunResult first = run(resumed_dir.path, 4);
  ASSERT_TRUE(first.exited && first.exit_code == 0) << first.out << first.err;
  const RunResult resumed = run(resumed_dir.path, 8);
  ASSERT_TRUE(resumed.exited && resumed.exit_code == 0) << resumed.out << resumed.err;
  const Report want = parse(straight), got = parse(resumed);
  ASSERT_EQ(got.steps.at(0).size(), 4u) << "did not resume at step 4\n" << resumed.out;
  EXPECT_EQ(got.steps.at(0).begin()->first, 4);
  EXPECT_EQ(got.checksum, want.checksum) << straight.out << resumed.out;
  // The scale continued too (registered with the checkpoint).
  EXPECT_EQ(got.steps.at(0).rbegin()->second, want.steps.at(0).rbegin()->second);
}

INSTANTIATE_TEST_SUITE_P(Worlds, PrecisionProcesses,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_stage" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace tandem
