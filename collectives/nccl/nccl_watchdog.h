// Internal (libtandem_cuda; included by nccl/nccl_communicator.cpp only): the thread that watches
// one NCCL communicator's ops, as c10d's ProcessGroupNCCL watchdog does. Work::wait() no longer
// blocks the host, so something else has to notice that an op never ends: while ops are in
// flight it polls their events (soon after each new op, then less often) (marking them done or failed, and dropping the
// tensors they kept once the GPU is past them) and ncclCommGetAsyncError; an op past the timeout
// or an async error goes to its owner, which fails the pending ops and aborts the communicator.
//
// Ownership: owned by its communicator (the NcclWatchdogOwner), which must outlive it;
// the thread ("tandem-nccl-wd") starts in the constructor and is joined by the destructor. It
// holds the ops it watches (shared with their Work) until their end event fired.
// Thread-safety: add(), ops(), wait_idle() and stop() may be called from any thread but the
// watchdog's own. The owner's
// callbacks run on the watchdog thread, without any of its locks held.
// Errors: none thrown; failures reach the ops through the owner.
#pragma once

#include "collectives/nccl/nccl_op.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <thread>

namespace tandem::detail {

// What the watchdog reports to its communicator (called on the watchdog thread).
class NcclWatchdogOwner : public NcclOpOwner {
 public:
  // `op` failed (a CUDA error on its stream, or the communicator's own failure: then a no-op).
  virtual void op_failed(const std::shared_ptr<NcclOp>& op) = 0;
  // ncclCommGetAsyncError of the communicator, ncclSuccess once it was aborted (its ncclComm_t is
  // gone then: the owner serialises this with the abort).
  virtual ncclResult_t async_error_state() = 0;
  // NCCL reported `error`; `oldest` is the oldest pending op (null if none).
  virtual void async_error(ncclResult_t error, const std::shared_ptr<NcclOp>& oldest) = 0;
};

class NcclWatchdog {
 public:
  // How often ops in flight are polled: kMinPoll after an op was added or one completed,
  // doubling up to kMaxPoll while none completes. A short op's completion time (timelines) is then
  // precise to tens of microseconds, and a long wait costs a few wake-ups, not one every 2 ms.
  static constexpr std::chrono::microseconds kMinPoll{50};
  static constexpr std::chrono::microseconds kMaxPoll{10000};

  NcclWatchdog(NcclWatchdogOwner& owner, int device, std::chrono::milliseconds timeout)
      : owner_(owner), device_(device), timeout_(timeout),
        thread_([this] { run(); }) {}

  ~NcclWatchdog() { stop(); }

  // Ends and joins the thread (idempotent). Callbacks in progress finish first.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  void add(std::shared_ptr<NcclOp> op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ops_.push_back(std::move(op));
      added_ = true;
    }
    cv_.notify_all();
  }

  // The ops not yet drained, oldest first.
  std::vector<std::shared_ptr<NcclOp>> ops() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ops_;
  }

  // Blocks until no op is pending (each one done, failed or timed out; at most about the timeout
  // after the last enqueue). For the communicator's destructor.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return none_pending(); });
  }

 private:
  bool none_pending() {  // under mutex_
    for (const auto& op : ops_) {
      if (op->pending()) return false;
    }
    return true;
  }

  void run() {
    pthread_setname_np(pthread_self(), "tandem-nccl-wd");
    cudaSetDevice(device_);  // this thread's own: event queries on the communicator's device
    std::unique_lock<std::mutex> lock(mutex_);
    std::chrono::microseconds pause = kMinPoll;
    while (!stop_) {
      if (ops_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !ops_.empty(); });
        continue;
      }
      added_ = false;
      std::vector<std::shared_ptr<NcclOp>> ops = ops_;
      lock.unlock();
      try {
        check(ops);
      } catch (...) {
        // Only allocation failures get here (the owner's callbacks do not throw): try again on
        // the next pass rather than end the process.
      }
      lock.lock();
      // Drop the ops the GPU is done with (new ones may have been added meanwhile).
      const size_t before = ops_.size();
      ops_.erase(std::remove_if(ops_.begin(), ops_.end(),
                                [](const std::shared_ptr<NcclOp>& op) { return op->drained(); }),
                 ops_.end());
      if (none_pending()) idle_cv_.notify_all();
      pause = ops_.size() < before ? kMinPoll : std::min(pause * 2, kMaxPoll);
      if (!ops_.empty()) {
        cv_.wait_for(lock, pause, [&] { return stop_ || added_; });
        if (added_) pause = kMinPoll;
      }
    }
  }

  // One pass over `ops` (oldest first), without mutex_.
  void check(const std::vector<std::shared_ptr<NcclOp>>& ops) {
    std::shared_ptr<NcclOp> oldest_pending;
    for (const auto& op : ops) {
      const NcclOp::Status status = op->poll();
      if (status == NcclOp::Status::kFailed) owner_.op_failed(op);
      if (status == NcclOp::Status::kPending && !oldest_pending) oldest_pending = op;
    }
    const ncclResult_t async = owner_.async_error_state();
    if (async != ncclSuccess && async != ncclInProgress) {
      if (!reported_async_) owner_.async_error(async, oldest_pending);
      reported_async_ = true;
      return;
    }
    if (oldest_pending && NcclOp::Clock::now() - oldest_pending->issued_at() > timeout_) {
      owner_.op_timed_out(oldest_pending, timeout_);
    }
  }

  NcclWatchdogOwner& owner_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::vector<std::shared_ptr<NcclOp>> ops_;
  bool added_ = false;  // an op came since the last pass: poll soon
  bool stop_ = false;
  bool reported_async_ = false;  // watchdog thread only
  std::thread thread_;           // last: starts once the members above exist
};

}  // namespace tandem::detail
