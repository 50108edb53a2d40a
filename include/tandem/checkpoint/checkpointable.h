// Checkpointable: what CheckpointManager saves and restores, as named tensors and values
// (StateDict). The manager's add_module/add_optimizer/add_rng/add_tensors/add_values wrap the
// built-in kinds; implement Checkpointable for state they do not cover and register it with add().
//
// Ownership: a StateDict holds references to its tensors (at::Tensor is reference counted).
// state_dict() may return live tensors: the manager has read them when save() returns (async mode
// copies them into staging buffers first). Tensors handed to load() are the object's to keep.
// Thread-safety: the manager calls an object from the thread that drives it (save, resume), never
// concurrently with itself.
// Errors: check() reports a mismatch as a message (resume() then throws CheckpointError); the dtype
// conversions throw CheckpointError for types a checkpoint cannot hold.
#pragma once

#include <tandem/checkpoint/format.h>

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace tandem {

// Named tensors and values of one registered state, in a stable order.
struct StateDict {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, CheckpointValue> values;

  const at::Tensor* find_tensor(const std::string& key) const;
  const CheckpointValue* find_value(const std::string& key) const;
};

// Anything that can be saved and restored. Implement it for state the built-in kinds do not cover.
class Checkpointable {
 public:
  virtual ~Checkpointable() = default;
  // Recorded in the manifest; a checkpoint only loads into a state of the same kind.
  virtual std::string kind() const = 0;
  // The current state. Tensors may be on any device (they are copied to host).
  virtual StateDict state_dict() = 0;
  // Empty when `loaded` fits this object; otherwise why not (resume() then throws). Must not
  // modify anything.
  virtual std::string check(const StateDict& loaded) = 0;
  // Restores a checked state (tensors are freshly loaded host tensors the object may keep).
  virtual void load(const StateDict& loaded) = 0;
  // True when every tensor of state_dict() changes only in an optimizer step (optimizer state).
  // An async save copies such tensors, and parameters (tensors that require grad), after save()
  // returns, overlapped with the next forward and backward (tandem::wait_for_checkpoint_staging).
  virtual bool changes_only_in_optimizer_step() const { return false; }
};

// A state of Sharding::kSliced: its tensors are pieces of flattened global tensors, keyed
// slice_key(global, begin, end) (ShardedDataParallel's parameters and optimizer state). Each rank
// saves its own pieces; resume() offers wants() every piece of the checkpoint - from every rank's
// file, whatever world size wrote it - reads those it accepts (each verified by its checksum) and
// hands them to check() and load(), with the state's values from rank 0's file.
class SlicedCheckpointable : public Checkpointable {
 public:
  virtual bool wants(const std::string& key) = 0;
  // Every piece this rank holds and every value check() needs, for a peer at the same position
  // (CheckpointManager::heal). state_dict() may leave out what another rank writes to the
  // checkpoint (a replica group's duplicate pieces, values only rank 0 records).
  virtual StateDict own_state() { return state_dict(); }
};

// Conversions between torch and checkpoint dtypes (CheckpointError for unsupported types).
DType to_checkpoint_dtype(at::ScalarType type);
at::ScalarType to_scalar_type(DType dtype);

namespace detail {

// Built-in pieces the runtime's own Checkpointables (DistributedDataParallel's fp32 masters,
// ShardedDataParallel's slices) build on; not for users.

// The state CheckpointManager::add_optimizer registers (SGD/Adam/AdamW/Adagrad/RMSprop; any other
// optimizer type throws CheckpointError naming the supported ones).
std::shared_ptr<Checkpointable> optimizer_state(torch::optim::Optimizer& optimizer,
                                                const std::string& name);

// Empty when `loaded` has exactly the tensors `want` (same names, dtypes, shapes); otherwise what
// differs first, for Checkpointable::check().
std::string check_same_tensors(const std::vector<std::pair<std::string, at::Tensor>>& want,
                               const StateDict& loaded);

// "expected float32 [4, 3], found float16 [4]" style description.
std::string describe_tensor(const at::Tensor& t);

}  // namespace detail

}  // namespace tandem
