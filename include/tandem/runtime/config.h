// tandem::Config: every component's typed options, filled from YAML files, TANDEM_* environment
// variables and --set overrides (docs/config.md).
//
//   Sources, later wins:  struct defaults < --config a.yaml < --config b.yaml <
//   TANDEM_DDP_BUCKET_CAP_MB=10
//                         < --set ddp.bucket_cap_mb=10
//
// Config is a plain value made of the components' own option structs (no parallel structs): the
// key registry (tandem/runtime/config_keys.h) says which key sets which member. Loading validates
// every value before anything starts; all problems of one load are reported together in one
// InvalidConfigError (a ConfigError) whose message names, per problem, the source
// (file:line:column, "--set k=v" or the variable), the key, the value, what is allowed and, for a
// misspelt key or choice, the closest valid one.
// Ownership: a Config is a value owned by its holder, except that copies share ddp.codec (a
// shared_ptr, stateful, built once by load_config): a second DistributedDataParallel needs
// make_codec(). load_config reads the files it is given and keeps nothing open.
// Thread-safety: load functions are reentrant; a Config may be read from several threads.
// Errors: load_config() throws InvalidConfigError listing every problem; take_config_args()
// throws InvalidConfigError for a flag without its value; make_codec() throws ConfigError for a
// codec/wire combination that does not exist.
#pragma once

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/collectives/compression.h>
#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/leak_detector.h>
#include <tandem/runtime/activation_checkpoint.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/fault_tolerance.h>
#include <tandem/runtime/grad_scaler.h>
#include <tandem/runtime/init.h>
#include <tandem/runtime/metrics.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

// Gradient compression: which codec DistributedDataParallel uses and each codec's parameters. Only
// the chosen codec's section matters.
struct CompressionConfig {
  std::string codec = "average";  // average | fp16 | bf16 | auto | powersgd | topk | sign
  std::string wire = "fp32";      // fp32 | fp16 | bf16: precision the codec's tensors travel in
  AutoOptions automatic;          // compression.auto.*
  PowerSgdOptions powersgd;
  TopKOptions topk;
  SignOptions sign;
};

// The libtorch CPU allocator: whether to install tandem's host stack, and how it is built.
struct AllocatorConfig {
  bool install = false;  // route libtorch's CPU allocations through tandem (Context does it)
  memory::HostMemoryStackOptions stack;
  memory::LeakDetectorOptions leaks;
};

// Mixed precision (docs/mixed_precision.md): what the training loop does. The parameters' dtype
// and the reduction's (precision.param_dtype, precision.reduce_in_fp32) are part of
// ddp.mixed_precision, which both data-parallel wrappers read.
struct PrecisionConfig {
  enum class Scaler { kAuto, kOn, kOff };
  at::ScalarType autocast = at::kFloat;  // precision.autocast: fp32 (off) | bf16 | fp16
  Scaler scaler_mode = Scaler::kAuto;    // precision.scaler.enabled: auto = on when fp16 is used
  GradScalerOptions scaler;              // precision.scaler.*: PyTorch's defaults
};

// How the world is laid out for parallelism (Context::mesh(), docs/config.md "Context"): the
// pipeline's stages here; the data-parallel ranks' split into shard groups is sharding.*.
struct ParallelOptions {
  int pp = 1;  // parallel.pp: pipeline stages; consecutive ranks form one pipeline
};

// What the example training programs read.
struct TrainOptions {
  int64_t steps = 100;
  uint64_t seed = 0;
  int64_t batch_size = 32;
  double lr = 1e-3;
  double weight_decay = 0.0;
  std::string data;  // input file; empty: the program's synthetic data
  // train.device: where the model trains: auto (cuda:LOCAL_RANK when a CUDA device exists, else
  // cpu), cpu, cuda (cuda:LOCAL_RANK) or cuda:N. Context::device() resolves it.
  std::string device = "auto";
};

struct Config {
  InitOptions comm;  // comm.env is the launcher's (DistEnv), not config
  ParallelOptions parallel;
  DistributedDataParallelOptions ddp;  // ddp.codec is built from `compression` by the loader
  ShardingOptions sharding;            // stage 0: DistributedDataParallel; 1-3: ShardedDataParallel
  CompressionConfig compression;
  PrecisionConfig precision;
  PipelineOptions pipeline;
  ActivationCheckpointOptions activation;
  AllocatorConfig allocator;
  CheckpointManagerOptions checkpoint;  // communicator, file system, callbacks: set in code
  TraceOptions trace;
  MetricsOptions metrics;
  FaultToleranceOptions ft;  // ft.*: step-level fault tolerance (docs/fault_tolerance.md)
  TrainOptions train;
  // The program's own keys (section `app`), as their text: those it registered with
  // register_app_key() (tandem/runtime/config_keys.h), or, when it registered none, any app.* key.
  std::map<std::string, std::string> app;

  // app.* key `key` as T (int64_t, double, bool or std::string): its value, else its registered
  // default. Throws ConfigError for a key neither set nor registered, or text that is not a T.
  template <class T>
  T app_value(const std::string& key) const;

  // A fresh codec from `compression` (nullptr for plain average over fp32). Throws ConfigError.
  std::shared_ptr<GradCodec> make_codec() const;
  // precision.scaler with `enabled` resolved (auto: on when autocast or the parameters are fp16).
  GradScalerOptions scaler_options() const;
};

// One problem found while loading.
struct ConfigIssue {
  std::string source;   // "train.yaml:3:5", "--set ddp.bucket_cap_mb=x", "TANDEM_DDP_BUCKET_CAP_MB"
  std::string key;      // dotted key ("" for syntax errors)
  std::string value;    // the text seen
  std::string message;  // the whole line: "<source>: <what>; <fix>"
};

// Every problem of one load. what(): "tandem: invalid configuration (N problems):\n  <message>...".
class InvalidConfigError : public ConfigError {
 public:
  explicit InvalidConfigError(std::vector<ConfigIssue> issues);
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

// Environment variables by name (tests inject a map; process_environment() reads the real one).
using Environment = std::map<std::string, std::string>;
Environment process_environment();

// What to load, in merge order.
struct ConfigInputs {
  std::vector<std::string> files;  // YAML files, later wins
  Environment env;                 // only TANDEM_* variables are looked at
  std::vector<std::string> sets;   // "key=value" overrides, later wins
};

// A loaded config and where each key's value came from ("default", "train.yaml:3:5",
// "TANDEM_X", "--set"). Keys absent from `source` kept their default.
struct LoadedConfig {
  Config config;
  std::map<std::string, std::string> source;
};

// Merges `inputs` over the defaults, validates, and builds config.ddp.codec. comm.env comes from
// DistEnv::from_env over inputs.env (the launcher contract), store_prefix from its run id and
// restart count. Throws InvalidConfigError listing every problem.
LoadedConfig load_config(const ConfigInputs& inputs);
// The comm section alone, as load_config reads it from `env` (TANDEM_COMM_* and the older
// TANDEM_TIMEOUT_S, TANDEM_SHM, TANDEM_GLOO_*), with the launcher's DistEnv: what
// InitOptions::from_env() returns. Other sections' variables are neither read nor checked.
// Throws InvalidConfigError.
InitOptions load_comm_config(const Environment& env);

// The tandem flags of a command line: --config FILE, --set K=V (also --config=FILE, --set=K=V),
// --print-config, --help-config.
struct ConfigArgs {
  std::vector<std::string> files;
  std::vector<std::string> sets;
  bool print_config = false;  // print the effective config and stop
  bool help_config = false;   // print every key with its default and doc, and stop
};

// Removes the tandem flags from argv (argc shrinks; argv[argc] stays nullptr) and returns them;
// the program's own arguments stay in order. Throws InvalidConfigError for a flag missing its
// value or a --set without '='.
ConfigArgs take_config_args(int& argc, char** argv);

}  // namespace tandem
