// The logic of tandem-tune (docs/tuning.md), apart from starting processes: a grid of config
// values expanded into trials, each trial's command line, its throughput read back from the
// metrics file the program wrote, the results table and the best config as YAML.
//
// Thread-safety: plain functions over values. Errors: ConfigError (or InvalidConfigError from the
// config loader) naming the grid argument, the key or the metrics file and what to do.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::tune {

// One axis of the grid: a config key and the values to try, as written ("ddp.bucket_cap_mb",
// {"1", "5", "25"}).
struct Axis {
  std::string key;
  std::vector<std::string> values;
};

// Parses "key=v1,v2,..." (one --grid argument). Throws ConfigError for a missing '=', an empty
// key or value, or a repeated value.
Axis parse_axis(const std::string& text);

// One point of the grid: (key, value) per axis, in axis order.
using Trial = std::vector<std::pair<std::string, std::string>>;

// Every combination, the first axis varying slowest. Throws ConfigError for a key given twice.
std::vector<Trial> expand(const std::vector<Axis>& axes);

// Checks every trial's values against the config registry before anything runs (unknown keys
// with "did you mean", wrong types, out of range). Throws InvalidConfigError.
void validate(const std::vector<Trial>& trials);

// The command line of one trial: `command`, then --set key=value for each grid value, then the
// tuner's own --set train.steps, metrics.file and metrics.log_every.
std::vector<std::string> trial_command(const std::vector<std::string>& command, const Trial& trial,
                                       int64_t steps, int64_t log_every,
                                       const std::string& metrics_file);

// Throughput of a trial from its metrics file (JSON lines of tandem::ProgressLogger): the median
// samples_per_s of the records after the first `warmup_records` (warm-up: allocations, bucket
// rebuild). nullopt when the file is missing or holds no record past the warm-up. Throws
// ConfigError naming the file and line for a malformed record.
std::optional<double> throughput(const std::string& metrics_file, int warmup_records);

struct TrialResult {
  Trial trial;
  std::optional<double> samples_per_s;  // nullopt: the trial failed
  std::string status;                   // "ok", "exit 1 (see trial_3.log)", ...
};

// Index of the fastest trial, or nullopt when none succeeded.
std::optional<size_t> best(const std::vector<TrialResult>& results);

// A fixed-width table, one row per trial, with each value's ratio to the best.
std::string format_table(const std::vector<TrialResult>& results);

// The best trial's values as a YAML config (nested by section), with a comment saying where it
// came from: pass it as one more --config after your own.
std::string best_config_yaml(const TrialResult& best, const std::string& comment);

// Scaling (tandem-tune --scale): `command` (a tandemrun command line) with its --nproc-per-node
// value replaced by `ranks`. Throws ConfigError when the command has no --nproc-per-node N.
std::vector<std::string> scale_command(const std::vector<std::string>& command, int ranks);

struct ScalePoint {
  int ranks = 0;
  std::optional<double> samples_per_s;  // nullopt: the run failed
  std::string status;
};

// ranks, samples/s, per rank, speedup over the first successful point and scaling efficiency
// (T1/TN)/N = throughput_N / (N x throughput_1) (the time of a fixed amount of work on N ranks
// against one: 1.0 is perfect scaling).
std::string format_scaling_table(const std::vector<ScalePoint>& points);

}  // namespace tandem::tune
