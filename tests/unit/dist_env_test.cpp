// The launcher environment contract: values, defaults, and the documented error messages.
#include <tandem/base/errors.h>
#include <tandem/runtime/dist_env.h>

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace tandem {
namespace {

DistEnv parse(const std::map<std::string, std::string>& vars) {
  return DistEnv::from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

const std::map<std::string, std::string> kGood = {
    {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
    {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29511"},
    {"TORCHELASTIC_RESTART_COUNT", "2"}, {"TORCHELASTIC_RUN_ID", "job7"},
    {"TORCHELASTIC_ERROR_FILE", "/tmp/err.json"}};

TEST(DistEnv, ReadsTheTorchrunVariables) {
  const DistEnv env = parse(kGood);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 29511);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.run_id, "job7");
  EXPECT_EQ(env.error_file, "/tmp/err.json");
  EXPECT_EQ(env.describe(), "rank 3/4 (local 1/2, node 1), master 10.1.2.3:29511");
  EXPECT_FALSE(env.agent_store);
  auto agent = kGood;
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // torchrun 2.x: its agent serves the store
  EXPECT_TRUE(parse(agent).agent_store);
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(parse(agent).agent_store);
}

TEST(DistEnv, NoLauncherMeansAWorldOfOne) {
  const DistEnv env = parse({});
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
}

TEST(DistEnv, RankMustBeBelowWorldSize) {
  auto vars = kGood;
  vars["RANK"] = "4";
  EXPECT_NE(error_of(vars).find("RANK=4 must be in [0, WORLD_SIZE=4)"), std::string::npos)
      << error_of(vars);
}

TEST(DistEnv, NonNumericValuesNameTheVariable) {
  auto vars = kGood;
  vars["WORLD_SIZE"] = "four";
  EXPECT_NE(error_of(vars).find("WORLD_SIZE='four' is not an integer"), std::string::npos);
  vars = kGood;
  vars["MASTER_PORT"] = "29500x";
  EXPECT_NE(error_of(vars).find("MASTER_PORT='29500x' is not an integer"), std::string::npos);
  vars = kGood;
  vars["RANK"] = "";
  EXPECT_NE(error_of(vars).find("RANK='' is not an integer"), std::string::npos);
}

TEST(DistEnv, MissingMasterAddressIsAnError) {
  auto vars = kGood;
  vars.erase("MASTER_ADDR");
  EXPECT_NE(error_of(vars).find("MASTER_ADDR is not set but WORLD_SIZE=4"), std::string::npos);
  vars = kGood;
  vars.erase("MASTER_PORT");
  EXPECT_NE(error_of(vars).find("MASTER_PORT is not set"), std::string::npos);
}

TEST(DistEnv, PortAndLocalRanksAreRangeChecked) {
  auto vars = kGood;
  vars["MASTER_PORT"] = "70000";
  EXPECT_NE(error_of(vars).find("MASTER_PORT=70000 must be in [1, 65535]"), std::string::npos);
  vars = kGood;
  vars["LOCAL_RANK"] = "2";
  EXPECT_NE(error_of(vars).find("LOCAL_RANK=2 must be in [0, LOCAL_WORLD_SIZE=2)"),
            std::string::npos);
  vars = kGood;
  vars["LOCAL_WORLD_SIZE"] = "5";
  EXPECT_NE(error_of(vars).find("LOCAL_WORLD_SIZE=5 must be in [1, WORLD_SIZE=4]"),
            std::string::npos);
}

TEST(DistEnv, HalfSetEnvironmentIsAnError) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"),
            std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}}).find("WORLD_SIZE is set but RANK is not"),
            std::string::npos);
}

TEST(DistEnv, ErrorsSayWhatToDo) {
  auto vars = kGood;
  vars["RANK"] = "9";
  EXPECT_NE(error_of(vars).find("tandemrun"), std::string::npos);
}

TEST(DistEnv, LoopbackAddresses) {
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("127.3.4.5"));
  EXPECT_TRUE(is_loopback_address("localhost"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_FALSE(is_loopback_address("node-127"));
}

}  // namespace
}  // namespace tandem
