// Internal (libtandem_cuda; included by nccl/nccl_communicator.cpp only): the Work of one NCCL op.
// wait() without a timeout orders the caller's current CUDA stream after the op and returns at
// once, as c10d's Work::synchronize; wait(timeout) also blocks the host until the op is done, or
// fails it and its communicator past `timeout`.
//
// Ownership: shares its NcclOp with the watchdog, and keeps its communicator (the NcclOpOwner)
// alive. Thread-safety: one thread at a time (communicator.h). Errors: wait() rethrows the op's
// error (TimeoutError, PeerLostError, CommError); CommError when CUDA refuses the stream wait.
#pragma once

#include "collectives/nccl/nccl_op.h"

#include <algorithm>
#include <thread>

namespace tandem::detail {

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclOp> op, std::shared_ptr<NcclOpOwner> owner)
      : op_(std::move(op)), owner_(std::move(owner)) {}

  void wait(std::chrono::milliseconds timeout) override {
    if (timeout != kDefaultTimeout) wait_on_host(timeout);
    const NcclOp::Status status = op_->poll();
    if (status == NcclOp::Status::kFailed) std::rethrow_exception(op_->error());
    if (status == NcclOp::Status::kDone) return;  // the GPU is past it: nothing to order
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(op_->device()));
    const cudaStream_t consumer =
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(op_->device())).stream();
    check_cuda(cudaStreamWaitEvent(consumer, op_->end_event(), 0), "cudaStreamWaitEvent");
  }

  bool is_completed() override { return op_->poll() != NcclOp::Status::kPending; }
  std::string describe() const override { return op_->description().str(); }
  std::optional<std::chrono::steady_clock::time_point> completed_at() override {
    return op_->completed_at();
  }

 private:
  void wait_on_host(std::chrono::milliseconds timeout) {
    const auto deadline = NcclOp::Clock::now() + timeout;
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      const NcclOp::Status status = op_->poll();
      if (status == NcclOp::Status::kDone) return;
      if (status == NcclOp::Status::kFailed) std::rethrow_exception(op_->error());
      if (NcclOp::Clock::now() >= deadline) {
        owner_->op_timed_out(op_, timeout);
        if (auto error = op_->error()) std::rethrow_exception(error);
        return;  // it completed meanwhile
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }

  const std::shared_ptr<NcclOp> op_;
  const std::shared_ptr<NcclOpOwner> owner_;  // keeps the communicator (and its stream) alive
};

}  // namespace tandem::detail
