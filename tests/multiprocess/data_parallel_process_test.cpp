// DistributedDataParallel with ranks as real processes: dp_worker trains under tandemrun and every
// rank must end with the same parameter bytes; one step matches the full-batch gradient in every
// process; a mismatched model fails on every rank without hanging.
#include "tests/launcher/tandemrun_process.h"
#include "tests/multiprocess/process_env.h"

#include <gtest/gtest.h>


#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem {
namespace {

using launcher_test::clean_env;
using launcher_test::RunResult;
using launcher_test::TandemrunProcess;
using namespace std::chrono_literals;
using testing::contains;
using testing::free_port;
using testing::rank_env;

std::string dp_worker() { return DP_WORKER_PATH; }

// rank -> the rest of the line after "[rank R]: <key> ".
std::map<int, std::string> values_after(const std::string& out, const std::string& key) {
  std::map<int, std::string> values;
  for (const auto& line : launcher_test::split_lines(out)) {
    int rank = -1;
    char rest[256] = {0};
    if (std::sscanf(line.c_str(), "[rank %d]: %255[^\n]", &rank, rest) != 2) continue;
    const std::string text = rest;
    if (text.rfind(key + " ", 0) == 0) values[rank] = text.substr(key.size() + 1);
  }
  return values;
}

class DistributedDataParallelProcesses : public ::testing::TestWithParam<int> {};

TEST_P(DistributedDataParallelProcesses, TwentyStepsThroughTandemrunEndBitwiseEqualOnEveryRank) {
  const int world = GetParam();
  const RunResult r = launcher_test::run_tandemrun(
      {"--standalone", "--nproc-per-node", std::to_string(world), dp_worker(), "train", "20"},
      clean_env(), 50s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto params = values_after(r.out, "PARAMS");
  ASSERT_EQ(params.size(), static_cast<size_t>(world)) << r.out;
  for (const auto& [rank, value] : params) {
    EXPECT_EQ(value, params.at(0)) << "rank " << rank << " ended with other parameters\n" << r.out;
    EXPECT_TRUE(contains(value, "after 20 steps")) << value;
  }
  for (const auto& [rank, value] : values_after(r.out, "BUCKETS")) {
    EXPECT_GT(std::stoi(value), 1) << "rank " << rank << ": the model should span several buckets";
  }
}

TEST_P(DistributedDataParallelProcesses, OneStepEqualsTheFullBatchGradientInEveryProcess) {
  const int world = GetParam();
  const RunResult r = launcher_test::run_tandemrun(
      {"--standalone", "--nproc-per-node", std::to_string(world), dp_worker(), "check-grads"},
      clean_env(), 50s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_TRUE(contains(r.out, "[rank " + std::to_string(rank) + "]: GRADS OK")) << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelProcesses, ::testing::Values(2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(DistributedDataParallelProcess, WorldOfOneIsBitwiseTheSingleProcessGradient) {
  auto env = clean_env();
  env.push_back("RANK=0");
  env.push_back("WORLD_SIZE=1");
  env.push_back("OMP_NUM_THREADS=1");
  TandemrunProcess worker({dp_worker(), "check-grads"}, env, /*through_tandemrun=*/false);
  const RunResult r = worker.finish(30s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "GRADS OK rel_error=0 exact=1 rank 0 of 1")) << r.out;
}

TEST(DistributedDataParallelProcess, MismatchedModelFailsOnEveryRankWithoutHanging) {
  const int port = free_port();
  std::vector<std::unique_ptr<TandemrunProcess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.push_back(std::make_unique<TandemrunProcess>(
        std::vector<std::string>{dp_worker(), "mismatch"}, rank_env(rank, 2, port, "10"),
        /*through_tandemrun=*/false));
  }
  for (int rank = 0; rank < 2; ++rank) {
    const RunResult r = workers[rank]->finish(40s);
    ASSERT_TRUE(r.exited) << "rank " << rank << "\n" << r.out << r.err;
    EXPECT_EQ(r.exit_code, 4) << "rank " << rank << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.out, "tandem error (ConfigError)")) << r.out;
    EXPECT_TRUE(contains(r.out,
                         "first difference at parameter #0: rank 0 '0.weight [32, 10] Float cpu'"
                         " vs rank 1 '0.weight [33, 10] Float cpu'"))
        << r.out;
    EXPECT_LT(r.seconds, 20.0) << r.out;
  }
}

}  // namespace
}  // namespace tandem
