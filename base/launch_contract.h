// The contract between tandemrun and the workers it starts, in one place for both sides
// (docs/launcher.md): the environment names tandemrun sets per worker, the exit codes, the error
// file a worker leaves when it fails, and the store keys of step-level fault tolerance.
// tandemrun (tools/tandemrun) and the worker (runtime/run_main.cpp, runtime/dist_env.cpp,
// runtime/ft/) include this header; neither spells a name or a key of its own.
//
// The error file is TorchElastic's JSON (what torch.distributed.elastic's @record writes, so
// torchrun reads ours), with two fields of tandem's in extraInfo:
//
//   {"message": {"message": "<Type>: <what>",
//                "extraInfo": {"py_callstack": "<text>", "timestamp": "<unix seconds>",
//                              "kind": "checkpoint", "restartable": false}}}
//
// tandemrun decides from `kind` and `restartable` alone, never from the message's text: a file
// without them (a Python worker's, the older flat form {"message": "<text>", "timestamp": N}) is an
// ordinary failure that a restart may fix.
//
// The worker's environment is read in two places only (scripts/check-layers holds it): DistEnv
// (runtime/dist_env.h) parses and checks the launcher's rank variables, and env() below reads the
// others, each by a name declared here.
//
// Torch-free. Ownership: values only. Thread-safety: pure functions (read_error_file reads a
// file; env() and environment() read the environment, so they race with a concurrent setenv).
// Errors: nothing throws; parse_error_file and read_error_file return nullopt for a missing or
// malformed file.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace tandem::launch {

// ---- environment: set by tandemrun for each worker, read by the worker's DistEnv --------------
inline constexpr char kEnvErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kEnvHeartbeatFile[] = "TANDEM_HEARTBEAT_FILE";
inline constexpr char kEnvFlightRecorderDir[] = "TANDEM_FLIGHT_RECORDER_DIR";
inline constexpr char kEnvMetricsFile[] = "TANDEM_METRICS_FILE";
inline constexpr char kEnvFtKeys[] = "TANDEM_FT";               // store prefix of ft_*_key below
inline constexpr char kEnvReplacement[] = "TANDEM_REPLACEMENT";  // incarnation of a replacement
inline constexpr char kEnvStandbyFd[] = "TANDEM_STANDBY_FD";     // tandemrun --standby's socket
// The launcher's rank variables (torchrun's names; DistEnv parses and checks them), for what must
// name its rank before or without DistEnv (the flight recorder's dumps).
inline constexpr char kEnvRank[] = "RANK";
inline constexpr char kEnvWorldSize[] = "WORLD_SIZE";
inline constexpr char kEnvLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kEnvRunId[] = "TORCHELASTIC_RUN_ID";
// Set by the user, not the launcher: "0" turns the flight recorder off; its ring's entries.
inline constexpr char kEnvFlightRecorder[] = "TANDEM_FLIGHT_RECORDER";
inline constexpr char kEnvFlightRecorderEntries[] = "TANDEM_FLIGHT_RECORDER_ENTRIES";

// The value of variable `name` (one of the kEnv names above); nullopt when it is unset or empty.
std::optional<std::string> env(const char* name);
// `name` as a decimal integer; `fallback` when unset, empty or not a number.
long env_int(const char* name, long fallback);
// Every variable of the environment (the config loader's TANDEM_<SECTION>_<KEY>, docs/config.md).
std::map<std::string, std::string> environment();

// ---- exit codes, of a worker and of tandemrun --------------------------------------------------
inline constexpr int kExitFailed = 1;  // failed; a restart may help
// A failure no restart can fix: a configuration error (a worker's), a bad command line
// (tandemrun's, before starting anything), or a worker error that is not restartable.
inline constexpr int kExitFinal = 2;

// ---- the error file ------------------------------------------------------------------------------
// What failed, from the exception's type (run_main) or the fatal signal.
enum class ErrorKind {
  kException,    // an exception that is not a tandem::Error
  kError,        // a tandem::Error of no more specific kind
  kConfig,       // tandem::ConfigError
  kComm,         // tandem::CommError
  kTimeout,      // tandem::TimeoutError
  kPeerLost,     // tandem::PeerLostError
  kCheckpoint,   // tandem::CheckpointError
  kFile,         // tandem::FileError that is not a CheckpointError
  kOutOfMemory,  // tandem::OutOfMemoryError
  kSignal,       // a fatal signal (SIGSEGV, SIGABRT, ...)
};

// "exception", "error", "config", "comm", "timeout", "peer_lost", "checkpoint", "file",
// "out_of_memory", "signal": the JSON spelling (a static string; async-signal-safe).
const char* kind_name(ErrorKind kind);

// A failure of a communication kind (comm, timeout, peer_lost) is usually the consequence of
// another worker's failure, not a cause: tandemrun looks past it for the root cause.
bool is_consequence(ErrorKind kind);

struct ErrorReport {
  std::string message;    // "<Type>: <what>"
  std::string callstack;  // extraInfo.py_callstack (may be empty)
  long long timestamp = 0;
  ErrorKind kind = ErrorKind::kException;
  bool restartable = true;  // false: tandemrun stops the job instead of restarting it
};

// The file's text for `report` (spaced as Python's json.dump writes it).
std::string error_file_json(const ErrorReport& report);

// Parses an error file's text with the project's strict JSON reader (base/json.h); nullopt when it
// is not valid JSON or has no message. Unknown kinds read as kException.
std::optional<ErrorReport> parse_error_file(const std::string& text);

// Reads and parses `path`; nullopt when the file is missing, unreadable (more than 1 MiB is
// truncated and then fails to parse) or malformed.
std::optional<ErrorReport> read_error_file(const std::string& path);

// ---- store keys of step-level fault tolerance (tandemrun --ft) ---------------------------------
// The prefix tandemrun passes in TANDEM_FT: one per run and restart, so an attempt never reads a
// report of the one before.
std::string ft_prefix(const std::string& run_id, int restart_count);
// tandemrun sets this to what happened when worker `rank` (incarnation `incarnation`) failed...
std::string ft_dead_key(const std::string& prefix, int rank, int incarnation);
// ...or, for a whole lost node, for each of its ranks, whatever incarnation ran there...
std::string ft_dead_any_key(const std::string& prefix, int rank);
// ...and counts every report here (workers poll this one key).
std::string ft_dead_count_key(const std::string& prefix);
// A worker sets this (to why) when the group cannot go on without a restart.
std::string ft_group_failed_key(const std::string& prefix);

}  // namespace tandem::launch
