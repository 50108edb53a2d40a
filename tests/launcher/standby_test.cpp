// tandemrun --standby with a program that does not wait in tandem::run_main: its standby exits
// before it is needed (it has no RANK), tandemrun says so and starts the worker normally, and the
// run ends as without --standby. The standby path of a tandem program (taken over, bit-identical
// resume) is tests/fault/fault_test.cpp's SigkilledWorkerWithStandby... test.
#include <gtest/gtest.h>

#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

// A worker in sh: exits 0 at once without RANK (what a standby sees); on attempt 0 rank 1 fails.
const char* kScript =
    "test -n \"$RANK\" || exit 0; "
    "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 3; fi; "
    "sleep 0.2; echo \"attempt $TORCHELASTIC_RESTART_COUNT rank $RANK\"";

TEST(StandbyTest, ProgramWithoutRunMainFallsBackToNormalStartsAndStillRestarts) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", "--standalone", "--max-restarts",
                                     "1", "--standby", "sh", "-c", kScript});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.err.find("rank 1 exited with code 3; restarting all workers"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the standby of local rank 0 exited before it was needed (does the program "
                       "call tandem::run_main?); starting the worker normally"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("taken over from standby"), std::string::npos) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "attempt 1 rank 0"), 1u) << r.out;
  EXPECT_EQ(count_occurrences(r.out, "attempt 1 rank 1"), 1u) << r.out;
}

TEST(StandbyTest, WithoutRestartsLeftNoStandbyIsStarted) {
  // --max-restarts 0: no next attempt, so nothing is started ahead (no message, plain run).
  const RunResult r = run_tandemrun(
      {"--nproc-per-node", "2", "--standalone", "--standby", "sh", "-c", "echo it ran"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "it ran"), 2u) << r.out;
  EXPECT_EQ(r.err.find("standby"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem::launcher_test
