#include "tools/tandemrun/launch/cluster_env.h"

#include <tandem/base/errors.h>

#include "base/slurm.h"
#include "base/strings.h"

namespace tandem::launcher {
namespace {

// A variable that holds a whole number >= `min`; nullopt when unset or empty.
std::optional<int> int_var(const EnvLookup& lookup, const char* name, int min) {
  const char* raw = lookup(name);
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  const auto v = strings::parse_int(raw);
  if (!v || *v < min || *v > 1'000'000'000) {
    throw ConfigError(std::string(name) + "='" + raw + "' is not a whole number >= " +
                      std::to_string(min) +
                      "; fix the variable or give the matching tandemrun option explicitly");
  }
  return static_cast<int>(*v);
}

std::optional<std::string> string_var(const EnvLookup& lookup, const char* name) {
  const char* raw = lookup(name);
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  return std::string(raw);
}

template <typename T>
std::optional<T> first_of(std::optional<T> a, std::optional<T> b) {
  return a ? a : b;
}

ClusterEnv from_slurm(const EnvLookup& lookup) {
  ClusterEnv env;
  env.source = "Slurm";
  env.run_id = string_var(lookup, "SLURM_JOB_ID");
  env.nnodes =
      first_of(int_var(lookup, "SLURM_NNODES", 1), int_var(lookup, "SLURM_JOB_NUM_NODES", 1));
  env.node_rank = int_var(lookup, "SLURM_NODEID", 0);
  if (auto list = first_of(string_var(lookup, "SLURM_JOB_NODELIST"),
                           string_var(lookup, "SLURM_NODELIST"))) {
    env.master_addr = slurm::first_host(*list);
  }
  // One tandemrun per node usually runs as one Slurm task per node, so the GPU count says more
  // about how many workers to start than the task count does.
  env.nproc_per_node = first_of(int_var(lookup, "SLURM_GPUS_ON_NODE", 1),
                                int_var(lookup, "SLURM_NTASKS_PER_NODE", 1));
  return env;
}

ClusterEnv from_kubeflow(const EnvLookup& lookup) {
  ClusterEnv env;
  env.source = "Kubeflow PyTorchJob";
  env.master_addr = string_var(lookup, "MASTER_ADDR");
  env.master_port = int_var(lookup, "MASTER_PORT", 1);
  env.nnodes = int_var(lookup, "WORLD_SIZE", 1);
  env.node_rank = int_var(lookup, "RANK", 0);
  return env;
}

}  // namespace

ClusterEnv detect_cluster_env(const EnvLookup& lookup) {
  if (string_var(lookup, "SLURM_JOB_ID")) return from_slurm(lookup);
  const bool kubeflow = string_var(lookup, "MASTER_ADDR") && string_var(lookup, "WORLD_SIZE") &&
                        string_var(lookup, "RANK") && !string_var(lookup, "LOCAL_RANK");
  if (kubeflow) return from_kubeflow(lookup);
  return ClusterEnv{};
}

}  // namespace tandem::launcher
