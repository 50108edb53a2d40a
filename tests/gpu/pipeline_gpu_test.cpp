// PipelineParallel with CUDA tensors across two processes sharing the GPU over Gloo (host-staged),
// on a side stream held before the step (tests/pipeline/pipeline_worker.cpp --cuda): every
// process's gradients equal the full-batch gradients, so each send waited for the kernels that
// produced its activation - the send thread posts it on the producer's stream - and each receive
// was ordered before its consumer (issue 37). Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "tests/launcher/tandemrun_process.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

class PipelineOnTheGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineOnTheGpu, TwoProcessesOnASideStreamMatchTheFullBatchGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::string> args = {"--standalone", "--nproc-per-node", "2",
                                   launcher_test::worker_path(), "check-grads", GetParam(), "4"};
  if (GetParam() == "interleaved") args.push_back("2");
  args.push_back("--cuda");
  auto env = launcher_test::clean_env();
  env.push_back("TANDEM_COMM_BACKEND=gloo");  // NCCL refuses two ranks on one GPU
  const launcher_test::RunResult r = launcher_test::run_tandemrun(args, env, 100s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "]: PIPE GRADS OK"), std::string::npos)
        << r.out << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineOnTheGpu,
                         ::testing::Values("1f1b", "zbh1", "interleaved"));

}  // namespace
}  // namespace tandem
