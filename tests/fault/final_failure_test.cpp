// Failures a restart cannot fix stop the job at once (issue 20 item 1): tandemrun does not restart
// them whatever --max-restarts says, exits 2 and says why. Real workers: the train_fault_tolerant
// example with a misspelt config key (exit 2, run_main's configuration error), and fault_worker
// meeting a checkpoint of another world size or an unwritable checkpoint directory. The control:
// an ordinary exception is still restarted (FaultTest.UnrecoverableFailureExhaustsRestarts...).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/fault/fault_fixture.h"

namespace tandem::launcher_test {
namespace {

void expect_stopped_at_once(const RunResult& r, const std::string& why) {
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.find("restarting all workers"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("restart 1 "), std::string::npos) << "a second attempt ran\n" << r.out;
  EXPECT_NE(r.err.find("a restart cannot fix it; not restarting"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
}

TEST_F(FaultTest, ConfigurationErrorIsNotRestarted) {
#ifndef TRAIN_FAULT_TOLERANT
  GTEST_SKIP() << "built without the examples (TANDEM_BUILD_EXAMPLES=OFF)";
#else
  // The repro: a misspelt key; run_main reports a configuration error and returns 2.
  const std::string config = dir_ + "/typo.yaml";
  std::ofstream(config) << "train:\n  stesp: 150\n";
  const RunResult r =
      run_tandemrun({"--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
                     TRAIN_FAULT_TOLERANT, "--config", config},
                    env_with({}), 60s);
  expect_stopped_at_once(r, "unknown key 'train.stesp'");
  EXPECT_NE(r.err.find("exited with code 2 (a configuration error)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tandemrun: failures:"), std::string::npos) << "one attempt only\n" << r.err;
#endif
}

TEST_F(FaultTest, CheckpointOfAnotherWorldSizeIsNotRestarted) {
  // Two workers save checkpoints with sharded state; three cannot resume from them.
  const RunResult two = run("worlds", {}, {});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const RunResult r = run("worlds", {"--max-restarts", "3"}, {}, {}, /*nproc=*/3);
  expect_stopped_at_once(r, "was saved by 2 ranks, this run has 3");
  EXPECT_NE(r.err.find("--set checkpoint.reshard=load_replicated_only"), std::string::npos) << r.err;
}

// The program's own error type says it is not restartable; its message has none of the words
// tandemrun once matched (issue 38): the error file's fields decide.
TEST_F(FaultTest, AnErrorMarkedNotRestartableIsNotRestartedWhateverItsMessage) {
  const RunResult r = run("permanent", {"--max-restarts", "3"},
                          {"FAULT_RANK=1", "FAULT_STEP=3", "FAULT_KIND=permanent"});
  expect_stopped_at_once(r, "ModelFormatError: the weights are of format 3; this build reads 2");
  EXPECT_NE(r.err.find("not restartable"), std::string::npos) << r.err;
}

TEST_F(FaultTest, UnwritableCheckpointDirectoryIsNotRestarted) {
  // A directory below a regular file can never be created (root included).
  std::ofstream(dir_ + "/file") << "not a directory\n";
  const RunResult r = run("file/unwritable", {"--max-restarts", "3"}, {});
  expect_stopped_at_once(r, "/file' exists and is not a directory");
}

}  // namespace
}  // namespace tandem::launcher_test
