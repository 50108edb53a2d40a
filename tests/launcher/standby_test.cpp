// tandemrun --standby with a program that does not wait in tandem::run_main: its standby exits
// before it is needed (it has no RANK), tandemrun says so and starts the worker normally, and the
// run ends as without --standby. The standby path of a tandem program (taken over, bit-identical
// resume) is tests/fault/fault_test.cpp's SigkilledWorkerWithStandby... test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "tests/launcher/tandemrun_process.h"
#include "tools/tandemrun/launch/standby_pool.h"

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
  // Each standby has usually exited by the restart; on a loaded machine sh may still be starting,
  // and then it does not take its environment. Either way the worker is started normally.
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(std::regex_search(
        r.err, std::regex("the standby of local rank " + rank +
                          " (exited before it was needed|did not take its environment) \\(does "
                          "the program call tandem::run_main\\?\\); starting the worker normally")))
        << r.err;
  }
  EXPECT_EQ(r.err.find("taken over from standby"), std::string::npos) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "attempt 1 rank 0"), 1u) << r.out;
  EXPECT_EQ(count_occurrences(r.out, "attempt 1 rank 1"), 1u) << r.out;
}

// The default (--max-restarts > 0, no --standby): standby processes only for a program that calls
// tandem::run_main (tandemrun reads the program's symbols), so a program that does not wait there
// is never started ahead without its environment. sh does not: nothing changes for it.
TEST(StandbyTest, DefaultKeepsNoStandbyForAProgramWithoutRunMain) {
  const RunResult r = run_tandemrun(
      {"--nproc-per-node", "2", "--standalone", "--max-restarts", "1", "sh", "-c", kScript});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.err.find("rank 1 exited with code 3; restarting all workers"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("standby"), std::string::npos) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "attempt 1 rank 0"), 1u) << r.out;
}

// The default's two checks. The ELF reader meets files it did not expect (a script, nothing,
// every truncation of a real program) without crashing and says no; the memory check refuses
// what no machine has and names the figures.
TEST(StandbyTest, RunMainCheckReadsOnlyWhatIsThere) {
  EXPECT_FALSE(launcher::program_calls_run_main(worker_path()));  // torch-free, no run_main
  EXPECT_FALSE(launcher::program_calls_run_main("/bin/sh"));
  EXPECT_FALSE(launcher::program_calls_run_main("/nonexistent/program"));
  std::ifstream in(worker_path(), std::ios::binary);
  const std::string elf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(elf.size(), 1000u);
  char path[] = "/tmp/tandem_elf_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  for (std::size_t size : {std::size_t{0}, std::size_t{4}, std::size_t{63}, std::size_t{64},
                           elf.size() / 3, elf.size() / 2, elf.size() - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << elf.substr(0, size);
    EXPECT_FALSE(launcher::program_calls_run_main(path)) << size << " bytes";
  }
  ::unlink(path);
}

TEST(StandbyTest, MemoryCheckRefusesWhatNoMachineHas) {
  EXPECT_EQ(launcher::standby_memory_shortage(0), std::nullopt);
  const auto shortage = launcher::standby_memory_shortage(100'000'000);  // 24 PiB of standbys
  ASSERT_TRUE(shortage.has_value());
  EXPECT_NE(shortage->find("MiB are available"), std::string::npos) << *shortage;
}

}  // namespace
}  // namespace tandem::launcher_test
