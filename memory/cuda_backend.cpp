// CUDA device and pinned-host backends, and the pluggable-allocator entry points.
#include <tandem/memory/cuda_backend.h>

#include <cuda_runtime_api.h>

#include <array>
#include <cstdio>
#include <memory>
#include <mutex>

#include <tandem/base/errors.h>
#include <tandem/memory/caching_pool.h>
#include <tandem/memory/memory_stats.h>

#include "memory/cuda_device_guard.h"

namespace tandem::memory {
namespace {

[[noreturn]] void cuda_oom(const char* what, std::size_t bytes, int device, cudaError_t err) {
  std::size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  cudaGetLastError();  // clear the sticky-free error state of the failed call
  throw OutOfMemoryError(std::string("tandem: ") + what + " of " + format_bytes(static_cast<std::int64_t>(bytes)) +
                         " on device " + std::to_string(device) + " failed: " + cudaGetErrorString(err) +
                         " (device free " + format_bytes(static_cast<std::int64_t>(free_b)) + " of " +
                         format_bytes(static_cast<std::int64_t>(total_b)) +
                         "); other processes or allocators may hold device memory");
}

}  // namespace

bool cuda_device_available() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

void* CudaDeviceBackend::do_allocate(std::size_t bytes, std::size_t alignment, StreamId) {
  if (alignment > kCudaMallocAlignment)
    throw ConfigError("tandem: CudaDeviceBackend(device " + std::to_string(device_) + ") supports alignments up to " +
                      std::to_string(kCudaMallocAlignment) + " bytes (what cudaMalloc guarantees), got " +
                      std::to_string(alignment) + "; put a CachingPool on top, which asks for no more");
  CudaDeviceGuard guard(device_);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) cuda_oom("cudaMalloc", bytes, device_, err);
  outstanding_.fetch_add(static_cast<std::int64_t>(bytes));
  return p;
}

void CudaDeviceBackend::do_deallocate(void* p, std::size_t bytes, std::size_t, StreamId) noexcept {
  CudaDeviceGuard guard(device_);
  const cudaError_t err = cudaFree(p);
  if (err != cudaSuccess) std::fprintf(stderr, "tandem: cudaFree(%p) failed: %s\n", p, cudaGetErrorString(err));
  outstanding_.fetch_sub(static_cast<std::int64_t>(bytes));
}

void* PinnedHostBackend::do_allocate(std::size_t bytes, std::size_t alignment, StreamId) {
  if (alignment > kPinnedHostAlignment)
    throw ConfigError("tandem: PinnedHostBackend supports alignments up to " + std::to_string(kPinnedHostAlignment) +
                      " bytes (a page), got " + std::to_string(alignment));
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) cuda_oom("cudaHostAlloc", bytes, -1, err);
  outstanding_.fetch_add(static_cast<std::int64_t>(bytes));
  return p;
}

void PinnedHostBackend::do_deallocate(void* p, std::size_t bytes, std::size_t, StreamId) noexcept {
  const cudaError_t err = cudaFreeHost(p);
  if (err != cudaSuccess) std::fprintf(stderr, "tandem: cudaFreeHost(%p) failed: %s\n", p, cudaGetErrorString(err));
  outstanding_.fetch_sub(static_cast<std::int64_t>(bytes));
}

namespace {

constexpr int kMaxDevices = 64;

struct DeviceStack {
  explicit DeviceStack(int device) : backend(device), pool(backend, options(device)) {}
  static CachingPoolOptions options(int device) {
    CachingPoolOptions o;  // the defaults: segments are asked for what the backend guarantees
    o.name = "cuda:" + std::to_string(device);
    return o;
  }
  CudaDeviceBackend backend;
  CachingPool pool;
};

// Immortal: freed tensors may reach tandem_cuda_free during static destruction.
std::array<std::atomic<DeviceStack*>, kMaxDevices>& stacks() {
  static auto* s = new std::array<std::atomic<DeviceStack*>, kMaxDevices>();
  return *s;
}

DeviceStack& stack_for(int device) {
  if (device < 0 || device >= kMaxDevices) throw ConfigError("tandem: CUDA device index out of range: " + std::to_string(device));
  auto& slot = stacks()[static_cast<std::size_t>(device)];
  DeviceStack* s = slot.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  s = slot.load(std::memory_order_acquire);
  if (s == nullptr) {
    s = new DeviceStack(device);
    slot.store(s, std::memory_order_release);
  }
  return *s;
}

}  // namespace
}  // namespace tandem::memory

extern "C" void* tandem_cuda_malloc(std::ptrdiff_t size, int device, void* stream) {
  using namespace tandem::memory;
  return stack_for(device).pool.allocate(static_cast<std::size_t>(size), kCudaMallocAlignment,
                                         StreamId{reinterpret_cast<std::uintptr_t>(stream)});
}

extern "C" void tandem_cuda_free(void* ptr, std::ptrdiff_t size, int device, void* stream) {
  using namespace tandem::memory;
  stack_for(device).pool.deallocate(ptr, static_cast<std::size_t>(size), kCudaMallocAlignment,
                                    StreamId{reinterpret_cast<std::uintptr_t>(stream)});
}

extern "C" void tandem_cuda_empty_cache() {
  using namespace tandem::memory;
  for (auto& slot : stacks())
    if (DeviceStack* s = slot.load(std::memory_order_acquire)) s->pool.release();
}

extern "C" int tandem_cuda_memory_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();  // no driver or no device: not an error for the caller's next CUDA call
  return n;
}
