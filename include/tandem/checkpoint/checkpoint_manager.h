// CheckpointManager: atomic, checksummed, asynchronous, sharded training-state checkpoints with a
// verified resume. The format and the guarantees are specified in docs/checkpoints.md.
//
//   tandem::CheckpointManagerOptions o;
//   o.directory = "ckpt"; o.every_n_steps = 100; o.keep_last = 3; o.communicator = world;
//   tandem::CheckpointManager ckpt(o);
//   ckpt.add_module("model", *model);                 // parameters + buffers (replicated)
//   ckpt.add_optimizer("optim", opt);                  // SGD/Adam/AdamW/Adagrad/RMSprop state
//   ckpt.add_rng("rng");                               // default CPU generator (per rank)
//   for (int64_t step = ckpt.resume(); step < steps; ++step) {
//     ...train...
//     ckpt.set_value("loader_position", pos);
//     ckpt.maybe_save(step + 1);                       // copies state, returns, writes in background
//   }
//   ckpt.wait();
//
// Saving: save() collects every registered state. Synchronous mode writes, fsyncs and commits
// before returning. Async mode (the default) copies the state into reused host staging buffers,
// hands it to the manager's writer thread ("tandem-ckpt") and returns; training goes on. While a
// CheckpointStagingFence lives (DistributedDataParallel, ShardedDataParallel and PipelineParallel
// hold one), save() copies at once only what may change before the next optimizer step (buffers,
// RNG, callbacks' tensors) and the writer copies the rest - parameters (tensors that require grad)
// and optimizer state, which change only in an optimizer step - while the next forward and
// backward run; the wrappers wait for that copy at the end of each backward
// (wait_for_checkpoint_staging()). A deferred tensor found changed when the writer copies it (its
// version counter moved) fails the save with an error that says so. At most one save is in
// flight: a save() while the previous one still writes waits for it first. The
// writer's errors are never dropped: they are rethrown (CheckpointError) by the next save(),
// maybe_save(), wait() or resume(); the destructor waits for the writer and reports a pending error
// through the warning handler (a destructor cannot throw).
//
// Sharding: each state is kReplicated (identical on all ranks, written once, by rank 0) or
// kSharded (each rank's own, written by every rank to its own file). Every rank writes its file in
// parallel; rank 0 commits the manifest only after all ranks reported success (two-phase commit
// over a private communicator, so it never interleaves with training collectives). Replicated
// state loads at any world size; sharded state needs the world size it was saved with (see
// ReshardPolicy).
//
// Resume: every rank lists the committed steps, verifies the newest candidates it needs (its
// files' sizes, headers, per-tensor and per-file XXH3) and skips corrupt, truncated or uncommitted
// ones with a warning naming the file and the reason; the ranks then agree (all-reduce) on the
// newest step valid on all of them, so no rank resumes from a different checkpoint than another.
// Nothing is modified until the agreed checkpoint has been verified. A checkpoint that verifies
// but does not fit the registered state (a missing or extra tensor, another shape, dtype or
// optimizer type, sharded state at another world size) makes resume() throw CheckpointError on
// every rank instead of silently falling back.
//
// Ownership: the manager refers to registered modules, optimizers, generators and callbacks
// without owning them (they must outlive it), except add_module(shared_ptr) and add(), which share
// ownership. It owns its staging buffers, its private communicator and its writer thread.
// Thread-safety: one thread drives the manager (register, save, resume, wait); the writer thread
// (a SerialExecutor) is internal. Construction with a communicator of size > 1 is collective (every
// rank constructs its manager at the same point), and so are save(), maybe_save() that saves, and
// resume().
// Errors: CheckpointError for invalid options or registrations, a save that was not committed (on
// every rank, saying which rank failed and why; the previous checkpoint stays the newest valid
// one), and a checkpoint that does not fit the registered state. Damaged checkpoints are skipped
// with a warning, never an error.
#pragma once

#include <tandem/base/file_system.h>
#include <tandem/checkpoint/checkpointable.h>
#include <tandem/checkpoint/format.h>

#include <ATen/core/Generator.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace tandem {

class Communicator;

// What resume() does with sharded state saved at another world size.
enum class ReshardPolicy {
  kError,                // throw CheckpointError (default): sharded state cannot be resharded
  kLoadReplicatedOnly,   // restore replicated state, leave sharded state as it is, warn
};

struct CheckpointManagerOptions {
  // Root directory of the step directories (created if missing). All ranks must see the same
  // directory (a shared file system when ranks span hosts).
  std::string directory;
  // maybe_save(step) saves when step > 0 and step % every_n_steps == 0 (0: maybe_save never saves).
  int64_t every_n_steps = 0;
  // Committed checkpoints kept; older ones are removed after each commit (0: keep all). A sync
  // save un-commits them before it returns and leaves unlinking their files to the writer thread.
  int keep_last = 3;
  // Background writer (true) or write-and-commit inside save() (false).
  bool async = true;
  // Ranks that checkpoint together (null or size 1: a single process). The manager creates a
  // private sub-communicator from it at construction (collective) and exchanges small int64 CPU
  // tensors over it, so it must reduce CPU tensors (Gloo; not an NCCL communicator).
  std::shared_ptr<Communicator> communicator;
  // The disk (null: posix_file_system()). Tests inject FaultInjectionFileSystem.
  std::shared_ptr<FileSystem> file_system;
  // User metadata written into every manifest.
  std::map<std::string, std::string> metadata;
  ReshardPolicy reshard = ReshardPolicy::kError;
  // Receives warnings (skipped checkpoints, cleanup failures). Null: "tandem: warning: ..." on stderr.
  std::function<void(const std::string&)> on_warning;
};

// Timings of the last completed save on this rank.
struct SaveStats {
  int64_t step = -1;
  uint64_t bytes = 0;          // bytes this rank wrote
  double blocked_s = 0;        // time save() kept the caller (async: the copy of what may change
                               // before the next optimizer step)
  uint64_t deferred_bytes = 0; // async: bytes the writer copied after save() returned
                               // (parameters, optimizer state)
  double staging_s = 0;        // async: the writer's copy of those bytes
  double write_s = 0;          // hashing + writing + fsync of this rank's shard
  double commit_s = 0;         // agreement + manifest + rename (rank 0) / waiting for it (others)
  double total_s = 0;          // from save() to committed
};

class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointManagerOptions options);
  // Waits for the writer; a pending error goes to the warning handler.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // ---- registration (before the first save or resume; names unique, no '/') ----
  // Parameters and buffers (recursively, torch's state_dict names). Default: replicated.
  void add_module(const std::string& name, torch::nn::Module& module,
                  Sharding sharding = Sharding::kReplicated);
  void add_module(const std::string& name, const std::shared_ptr<torch::nn::Module>& module,
                  Sharding sharding = Sharding::kReplicated);
  // Per-parameter state and per-group hyperparameters of SGD, Adam, AdamW, Adagrad or RMSprop
  // (any other optimizer type throws CheckpointError naming the supported ones).
  void add_optimizer(const std::string& name, torch::optim::Optimizer& optimizer,
                     Sharding sharding = Sharding::kReplicated);
  // A random generator's state; undefined `generator`: the default CPU generator. Default: sharded.
  void add_rng(const std::string& name, at::Generator generator = {},
               Sharding sharding = Sharding::kSharded);
  // Named tensors through callbacks.
  void add_tensors(const std::string& name,
                   std::function<std::map<std::string, at::Tensor>()> get,
                   std::function<void(const std::map<std::string, at::Tensor>&)> set,
                   Sharding sharding = Sharding::kReplicated);
  // Named user values through callbacks (data-loader position, scalars, strings).
  void add_values(const std::string& name,
                  std::function<std::map<std::string, CheckpointValue>()> get,
                  std::function<void(const std::map<std::string, CheckpointValue>&)> set,
                  Sharding sharding = Sharding::kReplicated);
  // Anything else.
  void add(const std::string& name, std::shared_ptr<Checkpointable> state, Sharding sharding);

  // ---- user values of the built-in replicated state "user" ----
  // Saved with every later save; value() returns what resume() restored (or the last set_value).
  void set_value(const std::string& key, CheckpointValue value);
  std::optional<CheckpointValue> value(const std::string& key) const;

  // ---- saving and resuming ----
  // Restores the newest checkpoint valid on every rank and returns its step (0 when there is none;
  // nothing is modified then). Waits for an in-flight save first.
  int64_t resume();
  // save(step) when every_n_steps divides step (> 0); returns whether it saved.
  bool maybe_save(int64_t step);
  // Saves the registered state as step `step` (>= 0). See the top of this file for async.
  void save(int64_t step);
  // Blocks until no save is in flight; rethrows the writer's error if it failed.
  void wait();
  // Blocks until the in-flight async save (if any) has copied the parameters and optimizer state
  // it snapshots; they may change afterwards. Cheap when nothing is being copied.
  void wait_staged();

  // ---- healing (step-level fault tolerance, docs/fault_tolerance.md) ----
  // Copies the registered state of rank `sources[i]` into rank `receivers[i]` over the manager's
  // communicator, as resume() would restore it from a checkpoint, but from a live peer: the
  // states' header in the shard file's format, then one tensor at a time (memory beyond the state:
  // one copy of its largest tensor), each checked by its XXH3-64 on arrival. Called by every
  // source and receiver with the same arguments (other ranks return at once); waits for an
  // in-flight save first. Replicated and per-rank (kSharded) states come from the source; a kSliced
  // state (ShardedDataParallel) heals only from a source that holds the same slices: the rank at
  // the same position in another replica group (FaultTolerantWorld::heal_sources). Errors:
  // CheckpointError for bad ranks (a source that is a receiver, a receiver listed twice), a state
  // that does not fit (its check(): other slices, another model) or a checksum mismatch; CommError
  // from the wire.
  void heal(const std::vector<int>& sources, const std::vector<int>& receivers);
  // heal() with one source for every receiver.
  void heal(int source, const std::vector<int>& receivers);

  // Committed steps on disk, newest first (no verification).
  std::vector<int64_t> committed_steps() const;
  // Step resume() restored (-1 before resume() or when nothing was restored).
  int64_t resumed_step() const;
  SaveStats last_save_stats() const;
  const CheckpointManagerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// When a checkpoint save of this process last committed, in seconds since the epoch (0: none
// yet). Live metrics report the checkpoint's age from it. Thread-safe.
double last_checkpoint_commit_time();

// wait_staged() of every live CheckpointManager of the process: the fence an optimizer step must
// pass (tandem's data-parallel wrappers call it at the end of each backward). Thread-safe.
void wait_for_checkpoint_staging();

// While one lives, the training loop promises to call wait_for_checkpoint_staging() before every
// change to parameters or optimizer state, so async saves may copy those after save() returns (see
// the top of this file). Held by tandem's data-parallel and pipeline wrappers; a loop of your own
// may hold one too. Thread-safe; not copyable.
class CheckpointStagingFence {
 public:
  CheckpointStagingFence();
  ~CheckpointStagingFence();
  CheckpointStagingFence(const CheckpointStagingFence&) = delete;
  CheckpointStagingFence& operator=(const CheckpointStagingFence&) = delete;
};

}  // namespace tandem
