// Slurm node lists and task lists, and the cluster variables (Slurm, Kubeflow PyTorchJob) that
// become tandemrun's launch defaults; plus, black-box, the precedence command line > PET_* >
// cluster variables > defaults and the one log line naming the source.
#include "tools/tandemrun/launch/cluster_env.h"

#include <gtest/gtest.h>
#include <tandem/base/errors.h>

#include "base/slurm.h"

#include <map>
#include <string>
#include <vector>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher {
namespace {

using Vars = std::map<std::string, std::string>;

ClusterEnv detect(const Vars& vars) {
  return detect_cluster_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SlurmNodelist, ExpandsRangesListsPaddingAndProducts) {
  using V = std::vector<std::string>;
  EXPECT_EQ(slurm::expand_nodelist("gpu5"), V{"gpu5"});
  EXPECT_EQ(slurm::expand_nodelist("node[01-03,07],gpu5"),
            (V{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(slurm::expand_nodelist("a[8-11]"), (V{"a8", "a9", "a10", "a11"}));
  EXPECT_EQ(slurm::expand_nodelist("a[098-101]"), (V{"a098", "a099", "a100", "a101"}));
  EXPECT_EQ(slurm::expand_nodelist("r[1-2]n[1-2]-ib"),
            (V{"r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"}));
  EXPECT_EQ(slurm::expand_nodelist("x[3],y,z[1,4]"), (V{"x3", "y", "z1", "z4"}));
  EXPECT_EQ(slurm::first_host("node[07-09],gpu5"), "node07");
  // The first host does not need the rest expanded (a huge list is fine).
  EXPECT_EQ(slurm::first_host("n[0-99999999]"), "n0");
}

TEST(SlurmNodelist, RejectsMalformedLists) {
  EXPECT_NE(error_of([] { slurm::expand_nodelist("node[01-03"); }).find("'[' without its ']'"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm::expand_nodelist("node01]"); }).find("']' without its '['"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm::expand_nodelist("n[5-3]"); }).find("range '5-3' runs backwards"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm::expand_nodelist("n[a-b]"); }).find("'a-b' is not a number range"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm::expand_nodelist("a,,b"); }).find("an empty host name"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm::expand_nodelist("n[0-99999999]"); }).find("more than 1000000"),
            std::string::npos);
}

TEST(SlurmTasksPerNode, ReadsRepeatsAndRejectsShortLists) {
  EXPECT_EQ(slurm::tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm::tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm::tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm::tasks_on_node("2(x3),1", 3), 1);
  EXPECT_NE(error_of([] { slurm::tasks_on_node("2(x3),1", 4); })
                .find("describes 4 nodes, not node 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm::tasks_on_node("2(x3", 0); }).find("lacks its ')'"),
            std::string::npos);
}

TEST(ClusterEnv, NothingDetectedOutsideAClusterOrInsideALaunchedWorker) {
  EXPECT_TRUE(detect({}).source.empty());
  // A worker of torchrun/tandemrun has LOCAL_RANK: not a PyTorchJob pod's launcher environment.
  const ClusterEnv env = detect(
      {{"MASTER_ADDR", "h"}, {"WORLD_SIZE", "4"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}});
  EXPECT_TRUE(env.source.empty());
}

TEST(ClusterEnv, SlurmGivesNodesRankHostRunIdAndWorkerCount) {
  const ClusterEnv env = detect({{"SLURM_JOB_ID", "4711"},
                                 {"SLURM_NNODES", "3"},
                                 {"SLURM_NODEID", "2"},
                                 {"SLURM_JOB_NODELIST", "node[07-09]"},
                                 {"SLURM_NTASKS_PER_NODE", "1"},
                                 {"SLURM_GPUS_ON_NODE", "4"}});
  EXPECT_EQ(env.source, "Slurm");
  EXPECT_EQ(env.nnodes, 3);
  EXPECT_EQ(env.node_rank, 2);
  EXPECT_EQ(env.master_addr, "node07");
  EXPECT_EQ(env.run_id, "4711");
  EXPECT_EQ(env.nproc_per_node, 4) << "GPUs on the node win over tasks per node";
  EXPECT_FALSE(env.master_port.has_value());
  // Without GPUs: tasks per node; older variable names.
  const ClusterEnv cpu = detect({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NUM_NODES", "2"},
                                 {"SLURM_NODELIST", "c5"}, {"SLURM_NTASKS_PER_NODE", "8"}});
  EXPECT_EQ(cpu.nnodes, 2);
  EXPECT_EQ(cpu.master_addr, "c5");
  EXPECT_EQ(cpu.nproc_per_node, 8);
}

TEST(ClusterEnv, KubeflowPyTorchJobGivesMasterAndNodeCount) {
  const ClusterEnv env = detect({{"MASTER_ADDR", "job-master-0"},
                                 {"MASTER_PORT", "23456"},
                                 {"WORLD_SIZE", "3"},
                                 {"RANK", "1"}});
  EXPECT_EQ(env.source, "Kubeflow PyTorchJob");
  EXPECT_EQ(env.master_addr, "job-master-0");
  EXPECT_EQ(env.master_port, 23456);
  EXPECT_EQ(env.nnodes, 3) << "WORLD_SIZE counts pods (nodes) in a PyTorchJob";
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_FALSE(env.nproc_per_node.has_value());
}

TEST(ClusterEnv, MalformedValuesNameTheVariable) {
  EXPECT_NE(error_of([] { detect({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "two"}}); })
                .find("SLURM_NNODES='two' is not a whole number >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              detect({{"MASTER_ADDR", "m"}, {"WORLD_SIZE", "2"}, {"RANK", "0"},
                      {"MASTER_PORT", "-5"}});
            }).find("MASTER_PORT='-5'"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::launcher

namespace tandem::launcher_test {
namespace {

// Black box: the real tandemrun with Slurm variables and the test worker's `env` mode.
TEST(ClusterEnvLaunch, SlurmFillsWhatTheCommandLineAndPetLeaveOut) {
  std::vector<std::string> env = clean_env();
  for (const char* v : {"SLURM_JOB_ID=777", "SLURM_NNODES=1", "SLURM_NODEID=0",
                        "SLURM_JOB_NODELIST=localhost", "SLURM_NTASKS_PER_NODE=2"})
    env.emplace_back(v);
  env.emplace_back("PET_MASTER_ADDR=127.0.0.1");  // PET_* beats the Slurm host
  const RunResult r = run_tandemrun({"--master-port", "29533", worker_path(), "env"}, env);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 1]: WORLD_SIZE=2\n"), std::string::npos)
      << "--nproc-per-node from SLURM_NTASKS_PER_NODE: " << r.out;
  EXPECT_NE(r.out.find("[rank 0]: TORCHELASTIC_RUN_ID=777\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0]: MASTER_ADDR=127.0.0.1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0]: MASTER_PORT=29533\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("tandemrun: launch settings from Slurm: nnodes=1 node_rank=0 "
                       "nproc_per_node=2 run_id=777; the rest from the command line, PET_* or "
                       "defaults\n"),
            std::string::npos)
      << r.err;
}

TEST(ClusterEnvLaunch, CommandLineBeatsClusterVariables) {
  std::vector<std::string> env = clean_env();
  for (const char* v : {"SLURM_JOB_ID=778", "SLURM_NTASKS_PER_NODE=3"}) env.emplace_back(v);
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "1", "--run-id", "mine", worker_path(), "env"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0]: WORLD_SIZE=1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0]: TORCHELASTIC_RUN_ID=mine\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("launch settings from Slurm: none (all given)"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace tandem::launcher_test
