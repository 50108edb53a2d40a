// tandem::DistEnv for a worker started directly by `srun` (no tandemrun, no torchrun): Slurm's
// step variables stand in for the torchrun ones; torchrun's variables win when both are there.
#include <gtest/gtest.h>
#include <tandem/base/errors.h>
#include <tandem/runtime/dist_env.h>

#include <map>
#include <string>

namespace tandem {
namespace {

using Vars = std::map<std::string, std::string>;

DistEnv parse(const Vars& vars) {
  return DistEnv::from_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// `srun -N2 --ntasks-per-node=3` on node[04-05], task 4 (second node, local 1).
const Vars kSrun = {{"SLURM_JOB_ID", "31337"},       {"SLURM_PROCID", "4"},
                    {"SLURM_NTASKS", "6"},           {"SLURM_LOCALID", "1"},
                    {"SLURM_NODEID", "1"},           {"SLURM_STEP_TASKS_PER_NODE", "3(x2)"},
                    {"SLURM_STEP_NODELIST", "node[04-05]"}, {"SLURM_RESTART_COUNT", "2"}};

TEST(DistEnvSlurm, SrunTaskReadsTheSlurmStepVariables) {
  const DistEnv env = parse(kSrun);
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 4);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.master_addr, "node04");
  EXPECT_EQ(env.master_port, 10000 + 31337 % 20000) << "derived from the job id";
  EXPECT_EQ(env.run_id, "31337");
  EXPECT_EQ(env.restart_count, 2);
}

TEST(DistEnvSlurm, MasterAddrAndPortGivenByTheUserWin) {
  Vars vars = kSrun;
  vars["MASTER_ADDR"] = "10.0.0.9";
  vars["MASTER_PORT"] = "29999";
  const DistEnv env = parse(vars);
  EXPECT_EQ(env.master_addr, "10.0.0.9");
  EXPECT_EQ(env.master_port, 29999);
}

TEST(DistEnvSlurm, TorchrunVariablesWinOverSlurm) {
  // tandemrun or torchrun inside a Slurm allocation: their workers see both sets.
  Vars vars = kSrun;
  vars.insert({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"}});
  const DistEnv env = parse(vars);
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.run_id, "");
}

TEST(DistEnvSlurm, SingleTaskAndPlainProcess) {
  const DistEnv one = parse({{"SLURM_JOB_ID", "5"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(one.source, "slurm");
  EXPECT_EQ(one.world_size, 1);
  EXPECT_EQ(one.local_world_size, 1);
  // An allocation's shell (no step: no SLURM_PROCID) is a world of one, as before.
  const DistEnv shell = parse({{"SLURM_JOB_ID", "5"}, {"SLURM_NNODES", "2"}});
  EXPECT_EQ(shell.source, "none");
  EXPECT_EQ(shell.world_size, 1);
}

TEST(DistEnvSlurm, InconsistentSlurmValuesAreConfigErrors) {
  Vars vars = kSrun;
  vars["SLURM_PROCID"] = "6";  // >= SLURM_NTASKS
  try {
    parse(vars);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=6 must be in [0, WORLD_SIZE=6)"),
              std::string::npos)
        << e.what();
  }
  vars = kSrun;
  vars["SLURM_STEP_NODELIST"] = "node[04-05";
  try {
    parse(vars);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'[' without its ']'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
