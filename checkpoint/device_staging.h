// Device-to-host staging of checkpoint tensors: tensors on an accelerator (CUDA) are copied into
// pinned host memory on a side stream of their device, ordered after the work the caller's
// current stream has queued, so a save neither waits for the device nor reads a tensor before its
// producer wrote it. Only c10's device-agnostic streams and events are used: libtandem needs no
// CUDA library (docs/DESIGN.md); the device runtime is reached through libtorch at run time.
// Not installed.
//
// Ownership: PinnedArena owns its pinned slabs (kept and reused from save to save). DeviceCopies
// holds every source and destination of its copies until synchronize() has seen them finish (its
// destructor synchronizes), so no copy reads or writes freed memory.
// Thread-safety: launch() on the thread that drives the manager (it reads that thread's current
// streams); synchronize() afterwards on any one thread (the async writer's).
// Errors: CheckpointError when pinned memory cannot be had; c10::Error from the device runtime.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::detail {

// Pinned host memory handed out in 512-byte aligned pieces of slabs of at least 64 MiB: the
// pinned allocator rounds each allocation up to a power of two, so a buffer per tensor would
// waste up to half of it. A save takes the same pieces in the same order as the last one, so the
// slabs are allocated once.
class PinnedArena {
 public:
  // Starts a save: the pieces handed out before may be reused.
  void reset();
  // `nbytes` of pinned host memory (a kByte tensor), valid until the next reset().
  at::Tensor take(size_t nbytes);
  // Pinned bytes held.
  size_t capacity() const;

 private:
  std::vector<at::Tensor> slabs_;
  size_t slab_ = 0;  // the slab pieces come from
  size_t used_ = 0;  // bytes of it handed out
};

// One save's copies of device tensors into pinned host memory.
class DeviceCopies {
 public:
  DeviceCopies() = default;
  ~DeviceCopies();  // synchronize()s; errors are dropped (a destructor cannot throw)
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;

  // Queues a copy of `src` (contiguous, on a device other than the CPU) into `dst` (pinned host
  // bytes, at least src's). `deferred`: src changes only in an optimizer step (parameters,
  // optimizer state), so the caller's stream need not wait for this copy; the training loop
  // promises wait_for_checkpoint_staging() first. Otherwise the caller's stream waits for it.
  void add(const at::Tensor& src, const at::Tensor& dst, bool deferred);
  // Enqueues every copy. Per device: its side stream waits for an event recorded on the caller's
  // current stream (the producers of every source); the immediate copies; the caller's current
  // stream waits for them (nothing queued after save() can change what they read); then the
  // deferred copies. Returns at once.
  void launch();
  // Blocks the host until every copy finished, then lets go of the sources. Idempotent.
  void synchronize();

  bool empty() const { return copies_.empty(); }
  uint64_t bytes(bool deferred) const;

 private:
  struct Copy {
    at::Tensor src;
    at::Tensor dst;
    bool deferred = false;
  };
  std::vector<Copy> copies_;
  std::vector<c10::Event> done_;  // per device: recorded after its last copy
};

}  // namespace tandem::detail
