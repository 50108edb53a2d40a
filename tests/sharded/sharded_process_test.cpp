// ShardedDataParallel with ranks as real processes under tandemrun (sharded_worker), world sizes
// 1-4: each stage ends with DistributedDataParallel's parameters, written by the consolidated
// export; each bad input fails on every rank with its message, without hanging.
#include "tests/launcher/tandemrun_process.h"

#include <tandem/checkpoint/safetensors.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
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
  return launcher_test::run_tandemrun(full, clean_env(), 90s);
}

// Trains `steps` steps at `stage` and returns the model the run wrote.
std::vector<std::pair<std::string, at::Tensor>> trained(int world, int stage, const std::string& dir) {
  const std::string out = dir + "/w" + std::to_string(world) + "_s" + std::to_string(stage) + ".safetensors";
  const RunResult r = run_worker(world, {"--set", "sharding.stage=" + std::to_string(stage),
                                         "--set", "train.steps=20", "--out", out});
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.out << r.err;
  return read_safetensors(out);
}

class ShardedProcesses : public ::testing::TestWithParam<int> {};

TEST_P(ShardedProcesses, EveryStageEndsWithDistributedDataParallelsParameters) {
  const int world = GetParam();
  TempDir dir("sharded");
  const auto ddp = trained(world, 0, dir.path);
  ASSERT_FALSE(ddp.empty());
  for (int stage : {1, 2, 3}) {
    const auto sharded = trained(world, stage, dir.path);
    ASSERT_EQ(sharded.size(), ddp.size()) << "stage " << stage;
    double worst = 0;
    for (size_t i = 0; i < ddp.size(); ++i) {
      ASSERT_EQ(sharded[i].first, ddp[i].first);
      worst = std::max(worst, (sharded[i].second - ddp[i].second).abs().max().item<double>());
    }
    // Bitwise where the reduction order allows (one or two ranks: a + b == b + a); otherwise
    // the bound of tests/sharded/sharded_test.cpp (20 AdamW steps of lr 1e-2 through ~1 ulp of
    // gradient rounding).
    if (world <= 2) {
      EXPECT_EQ(worst, 0.0) << "world " << world << " stage " << stage;
    } else {
      EXPECT_LE(worst, 2e-6) << "world " << world << " stage " << stage;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedProcesses, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// rank 0's "GLOBAL_LOSS <step> <loss>" lines.
std::map<int, double> global_losses(const std::string& out) {
  std::map<int, double> losses;
  for (const auto& line : launcher_test::split_lines(out)) {
    int rank = -1, step = -1;
    double loss = 0;
    if (std::sscanf(line.c_str(), "[rank %d]: GLOBAL_LOSS %d %lf", &rank, &step, &loss) == 3) losses[step] = loss;
  }
  return losses;
}

struct Reshard {
  int from, to;
};

class ShardedReshardProcesses : public ::testing::TestWithParam<Reshard> {};

TEST_P(ShardedReshardProcesses, SavedAtOneWorldSizeResumedAtAnotherContinuesToTheSameLoss) {
  const auto [from, to] = GetParam();
  TempDir dir("sharded");
  const std::vector<std::string> common = {"--mode", "reshard", "--set", "sharding.stage=3", "--set",
                                           "train.steps=10", "--set", "checkpoint.directory=" + dir.path,
                                           "--set", "checkpoint.keep_last=0", "--set", "checkpoint.async=false"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const RunResult straight = run_worker(from, with({"--set", "checkpoint.every_n_steps=5"}));
  ASSERT_TRUE(straight.exited && straight.exit_code == 0) << straight.out << straight.err;
  std::filesystem::remove_all(dir.path + "/step_0000000010");
  const RunResult resumed = run_worker(to, with({}));
  ASSERT_TRUE(resumed.exited && resumed.exit_code == 0) << resumed.out << resumed.err;
  const auto want = global_losses(straight.out);
  const auto got = global_losses(resumed.out);
  ASSERT_EQ(want.size(), 10u) << straight.out;
  ASSERT_EQ(got.size(), 5u) << "did not resume at step 5\n" << resumed.out;
  for (const auto& [step, loss] : got) {
    // The same global batch at every world size: only the reduction order differs.
    EXPECT_NEAR(loss, want.at(step), 1e-5 * std::abs(want.at(step))) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedReshardProcesses,
                         ::testing::Values(Reshard{2, 1}, Reshard{2, 3}, Reshard{3, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.from) + "_to_" + std::to_string(info.param.to);
                         });

void expect_fails_everywhere(const RunResult& r, int world, const std::string& message) {
  ASSERT_TRUE(r.exited) << "hung or killed\n" << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_NE(all.find("[rank " + std::to_string(rank) + "]"), std::string::npos) << all;
  }
  EXPECT_NE(all.find(message), std::string::npos) << all;
}

TEST(ShardedProcessErrors, UnitsThatDifferAcrossRanks) {
  expect_fails_everywhere(run_worker(2, {"--set", "sharding.stage=3", "--mode", "units-differ"}), 2,
                          "the ranks built different models or units");
}

TEST(ShardedProcessErrors, AParameterInTwoUnits) {
  expect_fails_everywhere(run_worker(2, {"--set", "sharding.stage=3", "--mode", "nested"}), 2,
                          "is in two units");
}

TEST(ShardedProcessErrors, AnOptimizerOverTheFullParameters) {
  expect_fails_everywhere(run_worker(2, {"--set", "sharding.stage=2", "--mode", "wrong-optimizer"}),
                          2, "build it over ShardedDataParallel::parameters()");
}

}  // namespace
}  // namespace tandem
