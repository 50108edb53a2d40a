// The environment every worker gets from tandemrun (the torchrun contract).
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <regex>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

using Env = std::map<std::string, std::string>;

// rank -> KEY -> VALUE from "[rank R]: KEY=VALUE" lines.
std::map<int, Env> parse_env(const std::string& out) {
  std::map<int, Env> envs;
  static const std::regex kLine(R"(^\[rank (\d+)\]: ([A-Z_]+)=(.*)$)");
  for (const auto& line : split_lines(out)) {
    std::smatch m;
    if (std::regex_match(line, m, kLine)) envs[std::stoi(m[1])][m[2]] = m[3];
  }
  return envs;
}

class EnvContract : public ::testing::TestWithParam<int> {};

TEST_P(EnvContract, EveryWorkerGetsTheTorchrunVariables) {
  const int n = GetParam();
  std::vector<std::string> env = clean_env();
  env.push_back("RANK=99");  // a stale value from the caller must be replaced
  env.push_back("TANDEM_TEST_MARKER=kept");
  env.push_back("TANDEM_FT=stale");
  const RunResult r = run_tandemrun({"--nproc-per-node", std::to_string(n), "--run-id",
                                     "run-" + std::to_string(n), worker_path(), "env"},
                                    env);
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;

  const auto envs = parse_env(r.out);
  ASSERT_EQ(envs.size(), static_cast<std::size_t>(n)) << r.out;
  for (int rank = 0; rank < n; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const Env& e = envs.at(rank);
    EXPECT_EQ(e.at("RANK"), std::to_string(rank));
    EXPECT_EQ(e.at("LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(e.at("WORLD_SIZE"), std::to_string(n));
    EXPECT_EQ(e.at("LOCAL_WORLD_SIZE"), std::to_string(n));
    EXPECT_EQ(e.at("GROUP_RANK"), "0");
    EXPECT_EQ(e.at("GROUP_WORLD_SIZE"), "1");
    EXPECT_EQ(e.at("ROLE_NAME"), "default");
    EXPECT_EQ(e.at("ROLE_RANK"), std::to_string(rank));
    EXPECT_EQ(e.at("ROLE_WORLD_SIZE"), std::to_string(n));
    EXPECT_EQ(e.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(e.at("MASTER_PORT"), "29500");
    EXPECT_EQ(e.at("TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(e.at("TORCHELASTIC_MAX_RESTARTS"), "0");
    EXPECT_EQ(e.at("TORCHELASTIC_RUN_ID"), "run-" + std::to_string(n));
    EXPECT_EQ(e.at("TORCHELASTIC_USE_AGENT_STORE"), "False");
    EXPECT_EQ(e.at("OMP_NUM_THREADS"), n > 1 ? "1" : "<unset>");
    EXPECT_EQ(e.at("TANDEM_TEST_MARKER"), "kept");
    EXPECT_EQ(e.at("TANDEM_FT"), "<unset>");  // also an inherited one is removed
  }
  // torchrun's notice, once, only when tandemrun set OMP_NUM_THREADS.
  EXPECT_EQ(count_occurrences(r.err, "OMP_NUM_THREADS is not set"), n > 1 ? 1u : 0u) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Workers, EnvContract, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "N" + std::to_string(info.param);
                         });

// --ft (docs/fault_tolerance.md): tandemrun serves the store, and says where it reports deaths.
// --ft-replace implies it; the first processes are no replacements (no TANDEM_REPLACEMENT).
TEST(EnvContractTest, FtWorkersUseTheLaunchersStore) {
  for (const char* flag : {"--ft", "--ft-replace"}) {
    SCOPED_TRACE(flag);
    const RunResult r = run_tandemrun(
        {"--standalone", flag, "--nproc-per-node", "2", "--run-id", "ftrun", worker_path(), "env"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto envs = parse_env(r.out);
    ASSERT_EQ(envs.size(), 2u);
    for (const auto& [rank, e] : envs) {
      EXPECT_EQ(e.at("TORCHELASTIC_USE_AGENT_STORE"), "True") << "rank " << rank;
      EXPECT_EQ(e.at("TANDEM_FT"), "tandemrun/ftrun/restart0/ft") << "rank " << rank;
      EXPECT_EQ(e.count("TANDEM_REPLACEMENT"), 0u) << "rank " << rank;
    }
  }
}

TEST(EnvContractTest, UserOmpNumThreadsIsKept) {
  std::vector<std::string> env = clean_env();
  env.push_back("OMP_NUM_THREADS=4");
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", worker_path(), "env"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto envs = parse_env(r.out);
  ASSERT_EQ(envs.size(), 2u);
  for (const auto& [rank, e] : envs) EXPECT_EQ(e.at("OMP_NUM_THREADS"), "4") << "rank " << rank;
  EXPECT_EQ(r.err.find("OMP_NUM_THREADS"), std::string::npos) << r.err;
}

TEST(EnvContractTest, MasterAddressPortAndGeneratedRunId) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "3", "--master-addr", "localhost",
                                     "--master-port", "23456", worker_path(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto envs = parse_env(r.out);
  ASSERT_EQ(envs.size(), 3u);
  const std::string run_id = envs.at(0).at("TORCHELASTIC_RUN_ID");
  EXPECT_FALSE(run_id.empty());
  EXPECT_NE(run_id, "<unset>");
  for (const auto& [rank, e] : envs) {
    EXPECT_EQ(e.at("MASTER_ADDR"), "localhost");
    EXPECT_EQ(e.at("MASTER_PORT"), "23456");
    EXPECT_EQ(e.at("TORCHELASTIC_RUN_ID"), run_id) << "every rank sees the same run id";
  }
}

TEST(EnvContractTest, UnderscoreSpellingsAreAccepted) {
  const RunResult r = run_tandemrun(
      {"--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", "23457", "--run_id",
       "underscored", "--node_rank", "0", "--grace_period_s", "1", worker_path(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto envs = parse_env(r.out);
  ASSERT_EQ(envs.size(), 2u);
  for (const auto& [rank, e] : envs) {
    EXPECT_EQ(e.at("WORLD_SIZE"), "2");
    EXPECT_EQ(e.at("MASTER_PORT"), "23457");
    EXPECT_EQ(e.at("TORCHELASTIC_RUN_ID"), "underscored");
  }
}

TEST(EnvContractTest, TorchrunPetVariablesAreRead) {
  std::vector<std::string> env = clean_env();
  env.push_back("PET_NPROC_PER_NODE=2");
  env.push_back("PET_MASTER_PORT=23458");
  const RunResult r = run_tandemrun({worker_path(), "env"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto envs = parse_env(r.out);
  ASSERT_EQ(envs.size(), 2u);
  EXPECT_EQ(envs.at(1).at("MASTER_PORT"), "23458");
}

TEST(EnvContractTest, StandalonePicksAFreePortSharedByAllRanks) {
  std::vector<int> ports;
  for (int run = 0; run < 2; ++run) {
    const RunResult r =
        run_tandemrun({"--nproc-per-node", "2", "--standalone", worker_path(), "env"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto envs = parse_env(r.out);
    ASSERT_EQ(envs.size(), 2u);
    const int port = std::stoi(envs.at(0).at("MASTER_PORT"));
    EXPECT_GE(port, 1);
    EXPECT_LE(port, 65535);
    EXPECT_EQ(envs.at(1).at("MASTER_PORT"), std::to_string(port));
    ports.push_back(port);
  }
  // The kernel hands out ephemeral ports in varying order; two runs rarely get the same one, but
  // equal ports would not be a bug, so this is only reported.
  if (ports[0] == ports[1])
    std::cout << "note: both --standalone runs got port " << ports[0] << "\n";
}

}  // namespace
}  // namespace tandem::launcher_test
