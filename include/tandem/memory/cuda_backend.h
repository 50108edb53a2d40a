// CUDA backends: device memory (cudaMalloc) and pinned host memory (cudaHostAlloc).
// Available when tandem is built with CUDA (TANDEM_HAVE_CUDA_MEMORY defined); they only need the
// CUDA runtime, not a CUDA build of libtorch.
//
// Ownership: a backend owns nothing but its counters; allocations belong to the caller until
// deallocated. The extern "C" entry points own one pool per device for the process's lifetime.
// Thread-safety: every backend and entry point may be called from any thread.
// Errors: OutOfMemoryError with the CUDA error and free/total memory when the driver refuses;
// ConfigError for unsupported alignments or device indices.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <tandem/memory/memory_resource.h>

namespace tandem::memory {

// The alignment cudaMalloc guarantees (CUDA C++ Programming Guide, "Device Memory Accesses":
// at least 256 bytes), and so what CudaDeviceBackend honours.
inline constexpr std::size_t kCudaMallocAlignment = 256;
// The alignment PinnedHostBackend honours (cudaHostAlloc returns whole pages).
inline constexpr std::size_t kPinnedHostAlignment = 4096;

// True when the CUDA runtime reports at least one device. Never throws.
bool cuda_device_available();

// Device memory of one GPU. allocate() selects `device` for the call (and restores the caller's
// device), so it can be used from any thread. Alignment up to kCudaMallocAlignment (256 bytes,
// cudaMalloc's guarantee; more throws ConfigError): a CachingPool with default options asks its
// segments for that, not its 4096-byte default, and serves 256-byte-aligned blocks.
// cudaMalloc failure throws OutOfMemoryError with the CUDA error and cudaMemGetInfo's free/total.
// deallocate() calls cudaFree, which synchronises the device: put a CachingPool on top
// (stream-aware reuse) so that happens only on release. Thread-safe.
class CudaDeviceBackend final : public MemoryResource {
 public:
  explicit CudaDeviceBackend(int device = 0) : device_(device) {}
  int device() const { return device_; }
  std::int64_t outstanding_bytes() const { return outstanding_.load(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;
  std::size_t do_max_alignment() const noexcept override { return kCudaMallocAlignment; }

  int device_;
  std::atomic<std::int64_t> outstanding_{0};
};

// Page-locked host memory (cudaHostAlloc, portable) for fast, asynchronous host<->device copies.
// Alignment up to kPinnedHostAlignment (4096, page-aligned). Thread-safe.
class PinnedHostBackend final : public MemoryResource {
 public:
  std::int64_t outstanding_bytes() const { return outstanding_.load(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept override;
  std::size_t do_max_alignment() const noexcept override { return kPinnedHostAlignment; }

  std::atomic<std::int64_t> outstanding_{0};
};

}  // namespace tandem::memory

// Entry points with the signatures of PyTorch 2.x's CUDAPluggableAllocator, backed by one
// CachingPool(CudaDeviceBackend(device)) per device with default options (small pool, best fit,
// stream-aware reuse: a block freed on a stream is reused only on that stream). For Python's
// torch.cuda.memory.CUDAPluggableAllocator, which has no record_stream hook: a tensor used on
// another stream must be synchronised by the caller before it dies. From C++, prefer
// tandem::memory::install_cuda_allocator() (cuda_allocator.h), which honours recordStream and
// adds statistics and tracking. Thread-safe.
extern "C" {
void* tandem_cuda_malloc(std::ptrdiff_t size, int device, void* stream);
void tandem_cuda_free(void* ptr, std::ptrdiff_t size, int device, void* stream);
// Releases the cached, unused device memory of every device back to the driver.
void tandem_cuda_empty_cache();
// Number of CUDA devices the runtime sees (0 without a driver or device). Never throws.
int tandem_cuda_memory_device_count();
}
