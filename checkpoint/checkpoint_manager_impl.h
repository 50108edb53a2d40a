// CheckpointManager internals shared by checkpoint_manager.cpp (registration, staging, the async
// writer, the two-phase commit) and checkpoint_resume.cpp (verified, agreed resume). Not installed.
#pragma once

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/collectives/communicator.h>

#include "checkpoint/step_directory.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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

// Host memory for staging and loading: large buffers are 2 MiB aligned and advised to use
// transparent huge pages, which cuts the first-touch page-fault cost of a fresh GiB several-fold.
at::Tensor host_buffer(at::IntArrayRef shape, at::ScalarType dtype);

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
  std::vector<at::Tensor> staging;  // reused host buffers (async mode)
  int64_t resumed = -1;

  // Writer thread state, guarded by `mu`.
  std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<Job> pending;  // handed over, not yet picked up
  bool busy = false;             // a job is pending or running
  bool stop = false;
  std::exception_ptr error;      // the last job's failure, not yet reported
  SaveStats stats;
  std::thread writer;

  void warn(const std::string& msg) const;

  // ---- collectives over the private communicator (no-ops for one process) ----
  int64_t allreduce_int(int64_t v, ReduceOp op) const;

  // All-gathers every rank's shard report; ranks whose write failed go to `failed`.
  std::vector<ShardReport> exchange_reports(const ShardReport& mine, bool ok,
                                            std::vector<int>* failed) const;

  // ---- the writer ----
  void writer_loop();

  // Phase 1 (every rank) and phase 2 (rank 0) of one save. Every rank runs the same collectives
  // whatever fails locally, so a failure never desynchronises the ranks.
  SaveStats run_job(Job& job);

  void wait_idle();

  void rethrow_error();

  // ---- saving ----
  std::vector<Entry> all_entries();

  bool any_sharded() const;

  std::unique_ptr<Job> collect(int64_t step);

  void save(int64_t step);

  // ---- resuming ----
  Candidate evaluate(int64_t step);

  int64_t resume();
};

}  // namespace tandem
