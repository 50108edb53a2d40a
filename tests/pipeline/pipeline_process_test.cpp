// PipelineParallel across real processes: pipeline_worker under tandemrun, 2 ranks, each schedule;
// every process's gradients equal the full-batch gradients. Ranks that disagree on the microbatch
// count fail with ConfigError in every process, quickly.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/launcher/tandemrun_process.h"
#include "tests/multiprocess/process_env.h"

namespace tandem {
namespace {

using launcher_test::clean_env;
using launcher_test::RunResult;
using namespace std::chrono_literals;

class PipelineProcesses : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineProcesses, TwoRanksThroughTandemrunMatchTheFullBatchGradients) {
  std::vector<std::string> args = {"--standalone", "--nproc-per-node", "2", launcher_test::worker_path(),
                                   "check-grads",  GetParam(),         "4"};
  if (GetParam() == "interleaved") args.push_back("2");
  const RunResult r = launcher_test::run_tandemrun(args, clean_env(), 40s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "]: PIPE GRADS OK"), std::string::npos)
        << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineProcesses,
                         ::testing::Values("1f1b", "zbh1", "interleaved"));

TEST(PipelineProcess, DisagreeingMicrobatchesFailInEveryProcessWithoutHanging) {
  const int port = testing::free_port();
  std::vector<std::unique_ptr<launcher_test::TandemrunProcess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    workers.push_back(std::make_unique<launcher_test::TandemrunProcess>(
        std::vector<std::string>{launcher_test::worker_path(), "mismatch"},
        testing::rank_env(rank, 2, port, "30"), /*through_tandemrun=*/false));
  }
  for (int rank = 0; rank < 2; ++rank) {
    const RunResult r = workers[rank]->finish(40s);
    ASSERT_TRUE(r.exited) << "rank " << rank << "\n" << r.out << r.err;
    EXPECT_EQ(r.exit_code, 4) << "rank " << rank << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("tandem error (ConfigError): pipeline ranks disagree"), std::string::npos)
        << r.out;
    EXPECT_LT(r.seconds, 20.0) << r.out;
  }
}

}  // namespace
}  // namespace tandem
