// CheckpointManager internals shared by its parts: checkpoint_manager.cpp (construction,
// registration, user values), checkpoint_save.cpp (collecting and staging state, the async writer),
// checkpoint_commit.cpp (one save's two-phase commit across ranks) and checkpoint_resume.cpp
// (verified, agreed resume). Not installed.
#pragma once

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/collectives/communicator.h>

#include "base/serial_executor.h"
#include "checkpoint/device_staging.h"
#include "checkpoint/step_directory.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {
namespace detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline std::string strip_prefix(const std::string& msg) {
  const std::string p = "tandem: checkpoint: ";
  return msg.rfind(p, 0) == 0 ? msg.substr(p.size()) : msg;
}

constexpr const char* kUserState = "user";

// Whether a CheckpointStagingFence lives (async saves may then defer parameters' copies).
bool staging_may_be_deferred();

struct Entry {
  std::string name;
  std::shared_ptr<Checkpointable> state;
  Sharding sharding;
};

// Everything one rank hands to the writer for one step.
struct Job {
  int64_t step = 0;
  bool has_file = false;
  std::vector<TensorSource> sources;
  std::vector<at::Tensor> keepalive;
  // Async: copies left to the writer (parameters, optimizer state) and their sources, alive until
  // copied. deferred_sources also lists the deferred device tensors (copied by `device`).
  std::vector<CopyTask> deferred;
  std::vector<at::Tensor> deferred_sources;
  std::vector<int64_t> deferred_versions;  // the sources' version counters at save()
  std::vector<std::string> deferred_names;
  std::string staging_error;  // a deferred tensor changed before it was copied
  // Device tensors' copies into pinned staging (device_staging.h): queued by collect(), waited
  // for before the write (sync: in save(); async: by the writer).
  DeviceCopies device;
  std::map<std::string, CheckpointValue> values;
  std::vector<ManifestState> states;
  Clock::time_point started;
  double blocked_s = 0;
};

// A verified candidate checkpoint as this rank sees it.
struct Candidate {
  enum Status { kValid, kInvalid, kIncompatible } status = kInvalid;
  std::string reason;
  bool loaded = false;  // `states` holds the data
  std::map<std::string, StateDict> states;
};

}  // namespace detail

struct CheckpointManager::Impl {
  using Clock = detail::Clock;
  using Entry = detail::Entry;
  using Job = detail::Job;
  using Candidate = detail::Candidate;

  CheckpointManagerOptions opts;
  std::shared_ptr<FileSystem> fs;
  std::shared_ptr<Communicator> comm;  // private group; null for a single process
  int rank = 0;
  int world = 1;
  std::vector<Entry> entries;
  std::map<std::string, CheckpointValue> user_values;
  std::vector<at::Tensor> staging_buffers;  // reused host buffers (async mode)
  detail::PinnedArena pinned;               // reused pinned staging of device tensors
  int64_t resumed = -1;

  // What the last save left, guarded by `mu` (async saves report from the writer's thread).
  std::mutex mu;
  std::exception_ptr error;  // the last save's failure, not yet reported
  SaveStats stats;
  bool staging = false;            // the writer still copies the in-flight save's deferred tensors
  std::condition_variable staged;  // notified (under `mu`) when it is done
  // Async saves run here, one at a time. Last member: it finishes its job before the state that
  // job uses is destroyed.
  SerialExecutor writer{"tandem-ckpt"};

  void warn(const std::string& msg) const;

  // ---- collectives over the private communicator (checkpoint_commit.cpp) ----
  // No-ops for a single process.
  int64_t allreduce_int(int64_t v, ReduceOp op) const;

  // All-gathers every rank's shard report; ranks whose write failed go to `failed`.
  // Why a save failed, on this rank: its own write error (with what keep_last costs on a full
  // disk), the ranks that failed, or rank 0's commit error.
  std::string failure_cause(const std::string& local_error, const std::vector<int>& failed,
                            const std::string& commit_error) const;
  // After a failed save: rank 0 removes the step's partial directory; says whether an earlier
  // checkpoint is still there to resume from.
  std::string after_failed_save(int64_t step) const;
  std::vector<detail::ShardReport> exchange_reports(const detail::ShardReport& mine, bool ok,
                                                    std::vector<int>* failed) const;

  // ---- one save's commit (checkpoint_commit.cpp) ----
  // Phase 1 (every rank) and phase 2 (rank 0) of one save. Every rank runs the same collectives
  // whatever fails locally, so a failure never desynchronises the ranks.
  SaveStats run_job(Job& job);

  // ---- saving (checkpoint_save.cpp) ----
  // Blocks until no async save is in flight.
  void wait_idle();
  // Rethrows (once) the error of a failed async save.
  void rethrow_error();

  // The registered states plus the built-in "user" values.
  std::vector<Entry> all_entries();
  bool any_sharded() const;

  // Snapshots every state this rank writes (copied into `staging` in async mode; device tensors
  // into `pinned`, on a side stream, in both modes).
  std::unique_ptr<Job> collect(int64_t step);

  void save(int64_t step);
  // Blocks until the writer copied the in-flight save's deferred tensors.
  void wait_staged();

  // ---- resuming (checkpoint_resume.cpp) ----
  Candidate evaluate(int64_t step);
  // Reads the pieces of every sliced state into `c`; false (and `c` invalid) on a damaged file.
  bool read_slices(const Manifest& m, int64_t step, Candidate* c);

  int64_t resume();
};

}  // namespace tandem
