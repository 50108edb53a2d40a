// Internal (libtandem_cuda; included by nccl/nccl_communicator.cpp only): one NCCL op in flight,
// shared by its Work (nccl_work.h), the communicator's watchdog (nccl_watchdog.h) and its failure
// path.
//
// On the GPU an op is: the NCCL stream waits for the caller's stream (an event), `start` event,
// the NCCL call, the copy back into a non-contiguous caller tensor, `end` event. The host never
// has to block for it: NcclWork::wait() makes the caller's current stream wait for `end`, and the
// watchdog notices completion, timeouts and NCCL's async errors.
//
// Ownership: an NcclOp holds its two events (from its communicator's pool, given back when the op
// goes: the watchdog keeps an op until its end event fired) and a reference to every tensor the
// NCCL stream reads or writes, which it drops once `end` has fired (tensors from libtorch's caching allocator are
// also recordStream'd by the communicator; the references cover memory from anywhere else).
// Thread-safety: every NcclOp member may be called from any thread (one mutex per op).
// Errors: poll() never throws (a CUDA error fails the op); the constructor throws CommError when
// CUDA cannot create an event.
#pragma once

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/flight_recorder.h>

#include "collectives/async_work.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tandem::detail {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw CommError(std::string("tandem: ") + what + " failed: " + cudaGetErrorString(err));
  }
}

inline void check_nccl(ncclResult_t res, const std::string& what) {
  if (res != ncclSuccess && res != ncclInProgress) {
    throw CommError("tandem: " + what + " failed: " + ncclGetErrorString(res) +
                    ". A peer rank probably died or the CUDA context is broken.");
  }
}

// CUDA events without timing, kept for reuse: an op takes two, and creating them was two driver
// calls per op. An event goes back once its op has drained (the GPU is past it), so a reused
// event is never still pending. Shared by a communicator and its ops (an op may outlive it).
class CudaEventPool {
 public:
  ~CudaEventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(e);
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// One event of a pool, given back with its owner.
class CudaEvent {
 public:
  explicit CudaEvent(std::shared_ptr<CudaEventPool> pool)
      : pool_(std::move(pool)), event_(pool_->take()) {}
  ~CudaEvent() { pool_->give(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  std::shared_ptr<CudaEventPool> pool_;
  cudaEvent_t event_ = nullptr;
};

class NcclOp {
 public:
  using Clock = AsyncWork::Clock;
  enum class Status { kPending, kDone, kFailed };

  // `description` carries the op's flight-recorder entry (Communicator::issue), which the op
  // marks started and ended. Its two events come from `events`.
  NcclOp(OpDescription description, int device, const std::shared_ptr<CudaEventPool>& events)
      : description_(std::move(description)),
        device_(device),
        start_(events),
        end_(events),
        flight_id_(description_.flight_id) {}

  const OpDescription& description() const { return description_; }
  int device() const { return device_; }
  cudaEvent_t start_event() const { return start_.get(); }
  cudaEvent_t end_event() const { return end_.get(); }
  Clock::time_point issued_at() const { return issued_at_; }

  // Keeps `tensors` until `end` has fired.
  void keep(std::vector<at::Tensor> tensors) {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_ = std::move(tensors);
  }

  // Non-blocking: looks at the events. Marks the op started and done in the flight recorder, and
  // drops the kept tensors once `end` fired (also for a failed op, whose kernels drain after the
  // abort). A CUDA error fails the op.
  Status poll() {
    std::vector<at::Tensor> release;  // freed after the lock: a deleter may take its own locks
    std::lock_guard<std::mutex> lock(mutex_);
    if (drained_) return status_;
    if (!started_ && status_ == Status::kPending) {
      if (cudaEventQuery(start_.get()) == cudaSuccess) {
        started_ = true;
        FlightRecorder::instance().started(flight_id_);
      }
    }
    const cudaError_t state = cudaEventQuery(end_.get());
    if (state == cudaErrorNotReady) return status_;
    drained_ = true;
    release.swap(kept_);
    if (status_ != Status::kPending) return status_;
    if (state == cudaSuccess) {
      status_ = Status::kDone;
      completed_at_ = Clock::now();
      FlightRecorder::instance().ended(flight_id_);
    } else {
      end_with(std::make_exception_ptr(CommError(
          "tandem: " + description_.str() + " failed on cuda:" + std::to_string(device_) +
          ": CUDA reports " + cudaGetErrorString(state) +
          " for its stream. A kernel before or in this op failed and the CUDA context is "
          "unusable; restart the process (CUDA_LAUNCH_BLOCKING=1 names the failing kernel).")));
    }
    return status_;
  }

  // True while neither done nor failed (without looking at the events).
  bool pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_ == Status::kPending;
  }
  // True once `end` fired (or its query failed): the GPU no longer touches the op's tensors.
  bool drained() {
    std::lock_guard<std::mutex> lock(mutex_);
    return drained_;
  }

  // Ends a pending op with `error`; no-op once it ended. Returns whether this call ended it.
  bool fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (status_ != Status::kPending) return false;
    end_with(std::move(error));
    return true;
  }

  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

  std::optional<Clock::time_point> completed_at() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (status_ == Status::kPending) return std::nullopt;
    return completed_at_;
  }

 private:
  void end_with(std::exception_ptr error) {  // under mutex_
    std::string what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    status_ = Status::kFailed;
    completed_at_ = Clock::now();
    error_ = std::move(error);
    FlightRecorder::instance().ended(flight_id_, what);
  }

  const OpDescription description_;
  const int device_;
  const Clock::time_point issued_at_ = Clock::now();
  const CudaEvent start_;
  const CudaEvent end_;
  const uint64_t flight_id_;
  std::mutex mutex_;
  Status status_ = Status::kPending;
  bool started_ = false;
  bool drained_ = false;
  Clock::time_point completed_at_{};
  std::exception_ptr error_;
  std::vector<at::Tensor> kept_;
};

// What an op's Work and the watchdog need of their communicator.
class NcclOpOwner {
 public:
  virtual ~NcclOpOwner() = default;
  // `op` outlived `timeout` (the communicator's, or a wait's own): fails it with a TimeoutError,
  // breaks the communicator and aborts NCCL. Never throws.
  virtual void op_timed_out(const std::shared_ptr<NcclOp>& op, std::chrono::milliseconds timeout) = 0;
};

}  // namespace tandem::detail
