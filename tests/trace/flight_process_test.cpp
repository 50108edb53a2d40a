// The flight recorder with real processes under tandemrun (issue 19): a rank that stops issuing
// collectives and a rank that issues another one are found from the ranks' dumps
// (`tandem-trace flight`): the timed-out ranks dump by themselves, tandemrun asks the others
// (SIGUSR1) before stopping the group; a signalled worker dumps while it runs.
#include "tests/launcher/tandemrun_process.h"
#include "tools/trace-tools/flight_analysis.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

namespace tandem {
namespace {

using launcher_test::clean_env;
using launcher_test::RunResult;
using launcher_test::TandemrunProcess;
using namespace std::chrono_literals;

using launcher_test::TempDir;

RunResult run(const std::string& mode, const std::string& log_dir, int world = 3) {
  return launcher_test::run_tandemrun({"--standalone", "--nproc-per-node", std::to_string(world), "--log-dir",
                                       log_dir, LAUNCHER_TEST_WORKER, "--mode", mode, "--set",
                                       "comm.timeout_s=3"},
                                      clean_env(), 60s);
}

TEST(FlightRecorder, ARankThatStoppedIssuingIsNamedWithTheCollectiveItNeverIssued) {
  TempDir logs("flight-test");
  const RunResult r = run("behind", logs.path);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  const std::string dir = launcher_test::flight_dump_dir(r.err);
  ASSERT_FALSE(dir.empty()) << "tandemrun did not say where the dumps are\n" << r.err;
  EXPECT_NE(r.err.find("tandem-trace flight " + dir), std::string::npos) << r.err;
  const auto dumps = trace::read_flight_dir(dir);
  EXPECT_EQ(dumps.size(), 3u) << "every rank dumps: the timed-out ones by themselves, rank 1 on SIGUSR1";
  const std::string report = trace::format_flight_report(trace::analyze_flight(dumps));
  EXPECT_NE(report.find("rank 1 is behind on ranks [0, 1, 2]: its last collective there is allreduce #4"),
            std::string::npos) << report;
  EXPECT_NE(report.find("went on to allreduce #5"), std::string::npos) << report;
  // Waiting in it, or already failed in it (its op thread's own timeout came first).
  EXPECT_NE(report.find("in allreduce #5 (sum, 84 B float32) on ranks [0, 1, 2] (started"), std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 0 (dumped on timeout)"), std::string::npos) << report;
  EXPECT_NE(report.find("the ranks agree on every collective"), std::string::npos) << report;
  // The timeout's own message names the rank that never joined.
  EXPECT_NE((r.out + r.err).find("Rank(s) 1 never joined it"), std::string::npos) << r.out << r.err;
}

TEST(FlightRecorder, TheFirstCollectiveWhereTheRanksDisagreeIsNamed) {
  TempDir logs("flight-test");
  const RunResult r = run("mismatch", logs.path, 2);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  const std::string dir = launcher_test::flight_dump_dir(r.err);
  ASSERT_FALSE(dir.empty()) << r.err;
  const std::string report = trace::format_flight_report(trace::analyze_flight(trace::read_flight_dir(dir)));
  EXPECT_NE(report.find("first disagreement: collective #5 on ranks [0, 1]: rank 0 issued allreduce (sum, 84 B "
                        "float32), rank 1 issued broadcast (root 0, 84 B float32)"),
            std::string::npos) << report;
  // The timeout's own message points at the dump.
  EXPECT_NE((r.out + r.err).find("The flight recorder wrote"), std::string::npos) << r.out << r.err;
}

TEST(FlightRecorder, SigusrOneDumpsARunningWorker) {
  TempDir logs("flight-test");
  TandemrunProcess p({"--standalone", "--nproc-per-node", "2", "--log-dir", logs.path, LAUNCHER_TEST_WORKER,
                      "--mode", "idle"});
  ASSERT_TRUE(p.wait_for_stdout_count("ready pid=", 2, 30s)) << p.out() << p.err();
  for (const auto& [rank, pid] : launcher_test::ready_pids(p.out())) ::kill(pid, SIGUSR1);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::string dir;
  while (std::chrono::steady_clock::now() < deadline && dir.empty()) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(logs.path)) {
      if (e.path().filename() == "flight_rank1.json") dir = e.path().parent_path().string();
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_FALSE(dir.empty()) << "no dump after SIGUSR1\n" << p.out() << p.err();
  std::this_thread::sleep_for(300ms);
  const auto dumps = trace::read_flight_dir(dir);
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps.at(0).reason, "signal");
  EXPECT_EQ(dumps.at(0).ops.size(), 10u);
  const std::string report = trace::format_flight_report(trace::analyze_flight(dumps));
  EXPECT_NE(report.find("rank 0 (dumped on signal): idle: its last op, allreduce #9 (sum, 100 B float32), completed"),
            std::string::npos) << report;
  p.send(SIGTERM);
  p.finish(30s);
}

}  // namespace
}  // namespace tandem
