// A worker stopped by SIGSTOP cannot dump its own flight record (issue 28 item 11): tandemrun
// reads its ring without its help (include/tandem/collectives/flight_ring.h) and writes the dump
// beside its peers', so `tandem-trace flight` names the stopped rank and its last collective.
// Real processes: tandemrun over three flight_worker ranks on loopback Gloo.
#include "tests/launcher/tandemrun_process.h"
#include "tools/trace-tools/flight_analysis.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace tandem {
namespace {

using launcher_test::clean_env;
using launcher_test::RunResult;
using launcher_test::TempDir;
using namespace std::chrono_literals;

TEST(FlightRecorderStopped, TandemrunDumpsTheRingOfAStoppedRank) {
  TempDir logs("flight-stopped-test");
  const RunResult r = launcher_test::run_tandemrun(
      {"--standalone", "--nproc-per-node", "3", "--log-dir", logs.path, LAUNCHER_TEST_WORKER,
       "--mode", "stop", "--set", "comm.timeout_s=3"},
      clean_env(), 60s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  // tandemrun says it read the stopped rank's record, and where it put it.
  const std::string dir = launcher_test::flight_dump_dir(r.err);
  ASSERT_FALSE(dir.empty()) << "tandemrun did not say where the dumps are\n" << r.err;
  EXPECT_NE(r.err.find("is stopped (SIGSTOP or a debugger): tandemrun read its flight record "
                       "itself (5 ops) into " +
                       dir + "/flight_rank1.json"),
            std::string::npos)
      << r.err;
  const auto dumps = trace::read_flight_dir(dir);
  ASSERT_EQ(dumps.size(), 3u) << "rank 1 is stopped: its dump comes from tandemrun\n" << r.err;
  const trace::FlightDump& stopped = dumps.at(1);
  EXPECT_EQ(stopped.reason, "stopped");
  EXPECT_EQ(stopped.rank, 1);
  EXPECT_EQ(stopped.world_size, 3);
  ASSERT_EQ(stopped.ops.size(), 5u);
  for (size_t i = 0; i < stopped.ops.size(); ++i) {
    EXPECT_EQ(stopped.ops[i].op, "allreduce");
    EXPECT_EQ(stopped.ops[i].seq, i);
    EXPECT_EQ(stopped.ops[i].state, "completed");
    EXPECT_EQ(stopped.ops[i].group, "[0, 1, 2]");
    EXPECT_EQ(stopped.ops[i].backend, "gloo");
  }
  EXPECT_EQ(stopped.ops.back().detail, "sum, 80 B float32");
  const std::string report = trace::format_flight_report(trace::analyze_flight(dumps));
  EXPECT_NE(
      report.find("rank 1 is behind on ranks [0, 1, 2]: its last collective there is allreduce #4"),
      std::string::npos)
      << report;
  EXPECT_NE(report.find(
                "rank 1 (dumped on stopped): idle: its last op, allreduce #4 (sum, 80 B float32), "
                "completed"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("wrote no dump"), std::string::npos) << report;
}

}  // namespace
}  // namespace tandem
