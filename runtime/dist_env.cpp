#include <tandem/runtime/dist_env.h>

#include <tandem/base/errors.h>

#include "base/launch_contract.h"
#include "base/slurm.h"
#include "base/strings.h"

#include <cstdlib>
#include <optional>
#include <initializer_list>
#include <limits>
#include <map>

namespace tandem {

namespace {

constexpr const char* kFix =
    " Start workers with tandemrun (or torchrun), which sets the variables consistently.";

int parse_int(const DistEnv::Lookup& lookup, const char* name, int fallback) {
  const char* raw = lookup(name);
  if (raw == nullptr) return fallback;
  const std::optional<int64_t> v = strings::parse_int(raw);
  if (!v || *v < std::numeric_limits<int>::min() || *v > std::numeric_limits<int>::max()) {
    throw ConfigError("tandem: environment variable " + std::string(name) + "='" + raw +
                      "' is not an integer." + kFix);
  }
  return static_cast<int>(*v);
}

std::string parse_string(const DistEnv::Lookup& lookup, const char* name,
                         const std::string& fallback) {
  const char* raw = lookup(name);
  return raw == nullptr ? fallback : std::string(raw);
}

// The torchrun variables a task started directly by srun would have had (dist_env.h).
std::map<std::string, std::string> slurm_as_torchrun(const DistEnv::Lookup& lookup) {
  auto get = [&](std::initializer_list<const char*> names) -> const char* {
    for (const char* name : names) {
      const char* v = lookup(name);
      if (v != nullptr && *v != '\0') return v;
    }
    return nullptr;
  };
  std::map<std::string, std::string> vars;
  // Set whenever this runs (from_env checked); an empty value is kept so the error names it.
  const char* ntasks = lookup("SLURM_NTASKS");
  vars["RANK"] = lookup("SLURM_PROCID");
  vars["WORLD_SIZE"] = ntasks != nullptr ? ntasks : lookup("SLURM_NPROCS");
  if (const char* v = get({"SLURM_LOCALID"})) vars["LOCAL_RANK"] = v;
  const char* node = get({"SLURM_NODEID"});
  if (node != nullptr) vars["GROUP_RANK"] = node;
  if (const char* tasks = get({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    const int node_index = node != nullptr ? parse_int(lookup, "SLURM_NODEID", 0) : 0;
    vars["LOCAL_WORLD_SIZE"] = std::to_string(slurm::tasks_on_node(tasks, node_index));
  }
  if (const char* addr = get({"MASTER_ADDR"})) {
    vars["MASTER_ADDR"] = addr;
  } else if (const char* list =
                 get({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    vars["MASTER_ADDR"] = slurm::first_host(list);
  }
  const char* job = get({"SLURM_JOB_ID", "SLURM_JOBID"});
  if (const char* port = get({"MASTER_PORT"})) {
    vars["MASTER_PORT"] = port;
  } else if (job != nullptr) {
    const long long id =
        parse_int(lookup, lookup("SLURM_JOB_ID") != nullptr ? "SLURM_JOB_ID" : "SLURM_JOBID", 0);
    vars["MASTER_PORT"] = std::to_string(10000 + (id % 20000 + 20000) % 20000);
  }
  if (job != nullptr) vars["TORCHELASTIC_RUN_ID"] = job;
  if (const char* v = get({"SLURM_RESTART_COUNT"})) vars["TORCHELASTIC_RESTART_COUNT"] = v;
  if (const char* v = get({launch::kEnvErrorFile})) vars[launch::kEnvErrorFile] = v;
  return vars;
}

}  // namespace

DistEnv DistEnv::from_env(const Lookup& lookup) {
  const bool torchrun = lookup("RANK") != nullptr || lookup("WORLD_SIZE") != nullptr;
  const bool srun = !torchrun && lookup("SLURM_PROCID") != nullptr &&
                    (lookup("SLURM_NTASKS") != nullptr || lookup("SLURM_NPROCS") != nullptr);
  if (srun) {
    const std::map<std::string, std::string> vars = slurm_as_torchrun(lookup);
    DistEnv env = from_env([&vars](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
    env.source = "slurm";
    return env;
  }
  DistEnv env;
  if (torchrun) env.source = "torchrun";
  const bool launched = lookup("RANK") != nullptr || lookup("WORLD_SIZE") != nullptr;
  env.world_size = parse_int(lookup, "WORLD_SIZE", 1);
  env.rank = parse_int(lookup, "RANK", 0);
  if (launched && lookup("WORLD_SIZE") == nullptr) {
    throw ConfigError("tandem: RANK is set but WORLD_SIZE is not." + std::string(kFix));
  }
  if (launched && lookup("RANK") == nullptr) {
    throw ConfigError("tandem: WORLD_SIZE is set but RANK is not." + std::string(kFix));
  }
  env.local_rank = parse_int(lookup, "LOCAL_RANK", env.rank);
  env.local_world_size = parse_int(lookup, "LOCAL_WORLD_SIZE", env.world_size);
  env.group_rank = parse_int(lookup, "GROUP_RANK", 0);
  env.restart_count = parse_int(lookup, "TORCHELASTIC_RESTART_COUNT", 0);
  env.run_id = parse_string(lookup, "TORCHELASTIC_RUN_ID", "");
  env.error_file = parse_string(lookup, launch::kEnvErrorFile, "");
  const std::string agent_store = parse_string(lookup, "TORCHELASTIC_USE_AGENT_STORE", "");
  env.agent_store = agent_store == "True" || agent_store == "true" || agent_store == "1";
  env.ft_keys = parse_string(lookup, launch::kEnvFtKeys, "");
  env.ft_join = env.ft_keys.empty() ? 0 : parse_int(lookup, launch::kEnvReplacement, 0);
  if (env.world_size > 1) {
    for (const char* required : {"MASTER_ADDR", "MASTER_PORT"}) {
      const char* v = lookup(required);
      if (v == nullptr || *v == '\0') {
        throw ConfigError("tandem: " + std::string(required) + " is not set but WORLD_SIZE=" +
                          std::to_string(env.world_size) +
                          " needs a rendezvous address (the host and port of rank 0)." + kFix);
      }
    }
  }
  env.master_addr = parse_string(lookup, "MASTER_ADDR", env.master_addr);
  env.master_port = parse_int(lookup, "MASTER_PORT", env.master_port);
  env.validate();
  return env;
}

DistEnv DistEnv::from_env() {
  return from_env([](const char* name) -> const char* { return std::getenv(name); });
}

void DistEnv::validate() const {
  auto fail = [](const std::string& what) { throw ConfigError("tandem: " + what + kFix); };
  if (world_size < 1) fail("WORLD_SIZE=" + std::to_string(world_size) + " must be at least 1.");
  if (rank < 0 || rank >= world_size) {
    fail("RANK=" + std::to_string(rank) + " must be in [0, WORLD_SIZE=" +
         std::to_string(world_size) + ").");
  }
  if (local_world_size < 1 || local_world_size > world_size) {
    fail("LOCAL_WORLD_SIZE=" + std::to_string(local_world_size) + " must be in [1, WORLD_SIZE=" +
         std::to_string(world_size) + "].");
  }
  if (local_rank < 0 || local_rank >= local_world_size) {
    fail("LOCAL_RANK=" + std::to_string(local_rank) + " must be in [0, LOCAL_WORLD_SIZE=" +
         std::to_string(local_world_size) + ").");
  }
  if (group_rank < 0) fail("GROUP_RANK=" + std::to_string(group_rank) + " must be >= 0.");
  if (master_port < 1 || master_port > 65535) {
    fail("MASTER_PORT=" + std::to_string(master_port) + " must be in [1, 65535].");
  }
  if (master_addr.empty()) fail("MASTER_ADDR is empty.");
  if (restart_count < 0) {
    fail("TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart_count) + " must be >= 0.");
  }
}

std::string DistEnv::describe() const {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + "/" + std::to_string(local_world_size) + ", node " +
         std::to_string(group_rank) + "), master " + master_addr + ":" +
         std::to_string(master_port);
}

bool is_loopback_address(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

}  // namespace tandem
