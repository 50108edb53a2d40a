// Bad command lines are rejected before anything starts (exit 2, a message saying what is wrong).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

struct BadCase {
  const char* name;
  std::vector<std::string> args;  // "WORKER" is replaced by the test worker's path
  const char* message;
};

// Names the case in ctest's listing instead of dumping its bytes.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadCommandLine : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadCommandLine, ExitsTwoWithAClearMessageAndStartsNothing) {
  std::vector<std::string> args = GetParam().args;
  for (auto& a : args) {
    if (a == "WORKER") a = worker_path();
  }
  const RunResult r = run_tandemrun(args);
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(std::string("tandemrun: error: ") + GetParam().message), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "") << "no worker may run";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadCommandLine,
    ::testing::Values(
        BadCase{"ZeroWorkers",
                {"--nproc-per-node", "0", "WORKER", "env"},
                "--nproc-per-node must be at least 1 (got 0)"},
        BadCase{"NegativeWorkers",
                {"--nproc-per-node", "-3", "WORKER", "env"},
                "--nproc-per-node must be at least 1"},
        BadCase{
            "WorkersNotANumber", {"--nproc-per-node", "two", "WORKER", "env"}, "Could not convert"},
        BadCase{"MissingWorkers", {"WORKER", "env"}, "--nproc-per-node is required"},
        BadCase{"PortTooBig",
                {"--nproc-per-node", "1", "--master-port", "70000", "WORKER", "env"},
                "--master-port must be in 1..65535 (got 70000)"},
        BadCase{"PortZero",
                {"--nproc-per-node", "1", "--master-port", "0", "WORKER", "env"},
                "--master-port must be in 1..65535 (got 0)"},
        BadCase{"StandaloneWithPort",
                {"--nproc-per-node", "1", "--standalone", "--master-port", "1234", "WORKER"},
                "--standalone picks a free port itself"},
        BadCase{"NodesMinAboveMax",
                {"--nnodes", "3:2", "--nproc-per-node", "1", "WORKER", "env"},
                "--nnodes 3:2: MIN is larger than MAX"},
        BadCase{"ElasticNodesStandalone",
                {"--nnodes", "1:4", "--nproc_per_node", "1", "--standalone", "WORKER", "env"},
                "--standalone is a single-node option"},
        BadCase{"MultiNodeNodeRankOutOfRange",
                {"--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "2", "WORKER", "env"},
                "--node-rank must be in 0..1 (got 2)"},
        BadCase{"MultiNodeWithoutToken",
                {"--nnodes", "2", "--nproc-per-node", "1", "WORKER", "env"},
                "a multi-node run needs a job token shared by all its nodes"},
        BadCase{"NodeRank",
                {"--nproc-per-node", "1", "--node-rank", "1", "WORKER", "env"},
                "--node-rank must be 0 for a single-node run (got 1)"},
        BadCase{"NegativeGrace",
                {"--nproc-per-node", "1", "--grace-period-s", "-1", "WORKER", "env"},
                "--grace-period-s must be between 0 and 3600"},
        BadCase{"MissingProgram", {"--nproc-per-node", "2"}, "no PROGRAM given"},
        BadCase{"ProgramNotFound",
                {"--nproc-per-node", "2", "/nonexistent/dir/prog"},
                "program '/nonexistent/dir/prog' not found"},
        BadCase{"ProgramNotInPath",
                {"--nproc-per-node", "2", "tandemrun-no-such-program"},
                "program 'tandemrun-no-such-program' not found in PATH"},
        BadCase{"ProgramIsADirectory",
                {"--nproc-per-node", "2", "/tmp"},
                "program '/tmp' is a directory"},
        BadCase{"UnknownOption",
                {"--nproc-per-node", "2", "--no-such-option", "3", "WORKER"},
                "unknown option '--no-such-option'"},
        BadCase{"NegativeMaxRestarts",
                {"--nproc-per-node", "1", "--max-restarts", "-1", "WORKER", "env"},
                "--max-restarts must be between 0 and 1000000 (got -1)"},
        BadCase{"ZeroMonitorInterval",
                {"--nproc-per-node", "1", "--monitor-interval", "0", "WORKER", "env"},
                "--monitor-interval must be between 0.001 and 60 seconds (got 0)"},
        BadCase{"NegativeHeartbeatTimeout",
                {"--nproc-per-node", "1", "--heartbeat-timeout", "-2", "WORKER", "env"},
                "--heartbeat-timeout must be between 0 (off) and 86400 seconds (got -2)"},
        // Issue 20 item 9: a standby takes over a restarted worker; without restarts it only
        // costs memory, so asking for one is a mistake worth naming.
        BadCase{"StandbyWithoutRestarts",
                {"--nproc-per-node", "2", "--standby", "WORKER", "env"},
                "--standby needs --max-restarts > 0"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(CommandLineTest, ProgramWithoutExecutePermissionIsRejected) {
  char path[] = "/tmp/tandemrun_not_executable_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::fchmod(fd, 0644);
  ::close(fd);
  const RunResult r = run_tandemrun({"--nproc-per-node", "1", path});
  ::unlink(path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not executable"), std::string::npos) << r.err;
}

TEST(CommandLineTest, HelpDocumentsEveryOption) {
  const RunResult r = run_tandemrun({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* option :
       {"--nnodes", "--node-rank", "--node_rank", "--nproc-per-node", "--nproc_per_node",
        "--master-addr", "--master-port", "--standalone", "--run-id", "--grace-period-s", "--help",
        "--max-restarts", "--monitor-interval", "--heartbeat-timeout", "--ft", "--ft-replace",
        "--version", "PROGRAM [ARGS...]", "Exit status"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << option << " missing from:\n" << r.out;
  }
}

// Issue 20 item 14: a single-node tandemrun starts without libtorch (it loaded it for the
// multi-node store before, ~0.4 s per start); the worker reads its launcher's memory map.
TEST(CommandLineTest, SingleNodeTandemrunDoesNotLoadLibtorch) {
  const RunResult r = run_tandemrun(
      {"--nproc-per-node", "1", "sh", "-c", "echo maps $(grep -c libtorch /proc/$PPID/maps)"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0]: maps 0\n"), std::string::npos) << r.out;
}

TEST(CommandLineTest, VersionPrintsAndExitsZero) {
  const RunResult r = run_tandemrun({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("tandemrun (tandem) ", 0), 0u) << r.out;
}

}  // namespace
}  // namespace tandem::launcher_test
