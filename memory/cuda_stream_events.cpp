// CUDA events for CrossStreamResource: record on a stream, poll, wait, recycle.
#include "memory/cuda_stream_events.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>
#include <vector>

#include "memory/cuda_device_guard.h"

namespace tandem::memory {
namespace {

cudaStream_t to_stream(StreamId s) { return reinterpret_cast<cudaStream_t>(s.value); }
cudaEvent_t to_event(StreamEvents::Event e) { return static_cast<cudaEvent_t>(e); }

void report(const char* what, int device, cudaError_t err) {
  std::fprintf(stderr, "tandem: CUDA memory of device %d: %s failed: %s\n", device, what, cudaGetErrorString(err));
  cudaGetLastError();  // do not leave the error for the caller's next CUDA call
}

class CudaStreamEvents final : public StreamEvents {
 public:
  explicit CudaStreamEvents(int device) : device_(device) {}

  ~CudaStreamEvents() override {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }

  Event record(StreamId stream) noexcept override {
    cudaEvent_t e = take();
    if (e != nullptr) {
      const cudaError_t err = cudaEventRecord(e, to_stream(stream));
      if (err == cudaSuccess) return e;
      report("cudaEventRecord", device_, err);
      release(e);
    }
    // No event: the block must not be reused before the stream is done, so wait now.
    const cudaError_t err = cudaStreamSynchronize(to_stream(stream));
    if (err != cudaSuccess) report("cudaStreamSynchronize", device_, err);
    return nullptr;
  }

  bool ready(Event event) noexcept override {
    const cudaError_t err = cudaEventQuery(to_event(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // not sticky, but keep the runtime's last error clean
      return false;
    }
    report("cudaEventQuery", device_, err);
    return true;
  }

  void wait(Event event) noexcept override {
    const cudaError_t err = cudaEventSynchronize(to_event(event));
    if (err != cudaSuccess) report("cudaEventSynchronize", device_, err);
  }

  void release(Event event) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      free_.push_back(to_event(event));
    } catch (...) {
      cudaEventDestroy(to_event(event));
    }
  }

 private:
  // A recycled event, or a new one created on device_ (events belong to a device); nullptr when
  // creation fails.
  cudaEvent_t take() noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    CudaDeviceGuard guard(device_);
    cudaEvent_t e = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err == cudaSuccess) return e;
    report("cudaEventCreateWithFlags", device_, err);
    return nullptr;
  }

  const int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace

std::shared_ptr<StreamEvents> make_cuda_stream_events(int device) {
  return std::make_shared<CudaStreamEvents>(device);
}

}  // namespace tandem::memory
