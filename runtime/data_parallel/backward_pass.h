// Internal to the data-parallel wrappers (runtime/ddp, runtime/sharded): one backward pass as both
// drive it. It owns the mode a wrapper is in between its forwards and backwards, the engine
// callback that finalizes a backward once autograd is done with it (queued at the backward's
// first gradient), and the misuse checks, worded alike for both wrappers: a forward while the
// last backward is unfinished, a gradient after its backward finished (retain_graph), a gradient
// twice in one backward. DistributedDataParallel plugs its bucket scheduler in around it
// (ddp/reducer_state.cpp), ShardedDataParallel its unit scheduler (sharded/sharded_reduce.cpp);
// each keeps its own fields.
// Thread-safety: none of its own; the wrapper calls it under the mutex that guards its state
// (gradients arrive on autograd threads). Errors: tandem::Error for misuse, as said per call.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tandem::detail {

class BackwardPass {
 public:
  enum class Mode {
    kIdle,            // no backward armed
    kAccumulating,    // armed under no_sync(): gradients stay local
    kSynchronizing,   // armed: gradients are reduced as they arrive
    kFinalized,       // a synchronised backward finished, and no forward has started since
    kUnfinished,      // finalize found a reduction that cannot complete (the next forward says why)
  };

  // `wrapper` names the wrapper in messages ("DistributedDataParallel").
  explicit BackwardPass(std::string wrapper) : wrapper_(std::move(wrapper)) {}

  Mode mode() const { return mode_; }
  // A backward is armed (synchronising or accumulating).
  bool armed() const { return mode_ == Mode::kSynchronizing || mode_ == Mode::kAccumulating; }
  // The first gradient of the armed backward has arrived (its finalize is queued).
  bool started() const { return callback_queued_; }

  // A forward begins: returns the mode the last step left and goes idle. Error (and idle) when
  // the last backward began but never finished (it raised, or its graph was dropped midway), or
  // finished unfinished (with fail()'s message).
  Mode begin_forward();
  // A backward will follow the forward: synchronising, or accumulating under no_sync().
  void arm(bool sync);
  // Parameter `name` received a gradient; `twice`: it had received one in this backward already.
  // True when the armed backward takes it; false when no backward of this wrapper is armed (one
  // it did not arm: the wrapper ignores the gradient). Queues `finalize` on the autograd engine at
  // the backward's first gradient. Error for a gradient after the backward finished, or twice.
  bool on_gradient(const std::string& name, bool twice, std::function<void()> finalize);
  // As if the first gradient had arrived, without queueing anything: the caller finalizes itself
  // (a joined rank's shadow backward).
  void start_without_callback() { callback_queued_ = true; }
  // finalize ran: a synchronised backward is done (kFinalized); an accumulating one is idle.
  void finish();
  // finalize found the reduction cannot complete: the next forward raises `message`.
  void fail(std::string message);
  // Back to idle with nothing queued (an aborted fault-tolerant step).
  void reset();

 private:
  std::string wrapper_;
  Mode mode_ = Mode::kIdle;
  bool callback_queued_ = false;
  std::string unfinished_;
};

}  // namespace tandem::detail
