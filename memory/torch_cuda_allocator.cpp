// libtandem_cuda side of install_cuda_allocator() (include/tandem/memory/cuda_allocator.h):
// per-device MemoryStacks behind libtorch's pluggable CUDA allocator hook.
//
// torch::cuda::CUDAPluggableAllocator (libtorch_cuda, PyTorch 2.x) forwards allocations to two
// functions and keeps the size/device/stream of each pointer, so a free reaches the pool with the
// stream the block was allocated on. Its recordStream, statistics and cacheInfo are no-ops or
// throw "not supported"; the subclass below answers them from the stacks, so libtorch's stream
// contract holds and torch::cuda's memory statistics show tandem's pool.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>

#include <tandem/base/errors.h>
#include <tandem/memory/cuda_backend.h>
#include <tandem/memory/memory_stack.h>

#include "memory/cuda_stream_events.h"

namespace tandem::memory {
namespace {

StreamId to_id(cudaStream_t s) { return StreamId{reinterpret_cast<std::uintptr_t>(s)}; }

// The stacks, element d for device d. Immutable once installed.
struct Devices {
  std::vector<std::shared_ptr<MemoryStack>> stacks;

  MemoryStack& at(c10::DeviceIndex device) const {
    TORCH_CHECK(device >= 0 && static_cast<std::size_t>(device) < stacks.size(), "tandem: CUDA device ",
                static_cast<int>(device), " is out of range: install_cuda_allocator() built stacks for ",
                stacks.size(), " devices (the devices CUDA saw when it was called)");
    return *stacks[static_cast<std::size_t>(device)];
  }
};

void* allocate_on(const Devices& d, std::size_t size, int device, cudaStream_t stream) {
  MemoryStack& s = d.at(static_cast<c10::DeviceIndex>(device));
  try {
    return s.top().allocate(size, kCudaMallocAlignment, to_id(stream));
  } catch (const OutOfMemoryError& e) {
    // libtorch catches c10's type (cuDNN retries with a smaller workspace, Python raises
    // torch.cuda.OutOfMemoryError); the message stays tandem's.
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  }
  return nullptr;  // unreachable
}

void c10_stat(c10::CachingAllocator::StatArray& out, const Stat& in) {
  auto& t = out[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  t.current = in.current;
  t.peak = in.peak;
  t.allocated = in.total;
  t.freed = in.freed;
}

using PluggableAllocator = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

class TandemCudaAllocator;
// The installed allocator, for the deleter of its tensors. Never destroyed: libtorch's own
// reference (the deleter it would use otherwise) dies with its static destructors, and CUDA
// tensors freed after that would crash.
std::atomic<TandemCudaAllocator*> g_allocator{nullptr};
void delete_cuda_tensor_memory(void* ptr);

class TandemCudaAllocator final : public PluggableAllocator {
 public:
  explicit TandemCudaAllocator(std::shared_ptr<const Devices> d)
      : PluggableAllocator([d](std::size_t size, int device, cudaStream_t s) { return allocate_on(*d, size, device, s); },
                           [d](void* p, std::size_t size, int device, cudaStream_t s) {
                             d->at(static_cast<c10::DeviceIndex>(device))
                                 .top()
                                 .deallocate(p, size, kCudaMallocAlignment, to_id(s));
                           }),
        devices_(std::move(d)) {}

  // Every DataPtr carries this deleter (context == data pointer, so raw frees work too).
  c10::DeleterFnPtr raw_deleter() const override { return &delete_cuda_tensor_memory; }

  using PluggableAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Like libtorch's allocator: memory it did not hand out (from_blob, ...) is the owner's business.
    if (ptr.get() == nullptr || ptr.get_deleter() != raw_deleter()) return;
    CrossStreamResource* cross = devices_->at(ptr.device().index()).cross_stream();
    if (cross != nullptr) cross->record_stream(ptr.get(), to_id(stream.stream()));
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const MemoryStats s = devices_->at(device).stats();
    c10::CachingDeviceAllocator::DeviceStats out;
    c10_stat(out.allocation, s.allocations);
    c10_stat(out.segment, s.segments);
    c10_stat(out.active, s.active_blocks);
    c10_stat(out.inactive_split, s.inactive_split_blocks);
    c10_stat(out.allocated_bytes, s.allocated_bytes);
    c10_stat(out.reserved_bytes, s.reserved_bytes);
    c10_stat(out.active_bytes, s.active_bytes);
    c10_stat(out.inactive_split_bytes, s.inactive_split_bytes);
    c10_stat(out.requested_bytes, s.requested_bytes);
    out.num_alloc_retries = s.alloc_retries;
    out.num_ooms = s.ooms;
    out.num_device_alloc = s.segments.total;
    out.num_device_free = s.segments.freed;
    const std::size_t split = devices_->at(device).pool().options().max_split_size;
    out.max_split_size = static_cast<std::int64_t>(std::min<std::size_t>(split, std::numeric_limits<std::int64_t>::max()));
    return out;
  }

  void resetPeakStats(c10::DeviceIndex device) override { devices_->at(device).reset_peak(); }

  void cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) override {
    *largest_block = static_cast<std::size_t>(devices_->at(device).stats().largest_free_block);
  }

  void emptyCache(c10::cuda::MempoolId_t /*mempool_id*/ = {0, 0}) override {
    for (const auto& s : devices_->stacks) s->top().release_cached();
  }

  void beginAllocateToPool(c10::DeviceIndex, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) override {
    TORCH_CHECK(false,
                "tandem: CUDA graph capture is not supported while tandem's CUDA allocator is installed "
                "(install_cuda_allocator): its pool would call cudaMalloc inside the capture. Capture graphs "
                "in a process that keeps libtorch's own allocator.");
  }

  std::string name() override { return "tandem"; }

 private:
  std::shared_ptr<const Devices> devices_;
};

void delete_cuda_tensor_memory(void* ptr) { g_allocator.load(std::memory_order_acquire)->raw_delete(ptr); }

std::mutex& install_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
// Kept for the life of the process (see g_allocator).
std::shared_ptr<TandemCudaAllocator>* g_installed = nullptr;

void check_installable(int devices) {
  if (g_installed != nullptr)
    throw ConfigError("tandem: install_cuda_allocator: tandem's CUDA allocator is already installed in this "
                      "process; call it once (installed_cuda_stacks() returns its stacks)");
  if (devices <= 0)
    throw ConfigError("tandem: install_cuda_allocator: the CUDA runtime sees no device (no GPU, no driver, or "
                      "CUDA_VISIBLE_DEVICES hides them); check with cuda_allocator_available() first");
  c10::cuda::CUDACachingAllocator::CUDAAllocator* current = c10::cuda::CUDACachingAllocator::get();
  if (current != nullptr && current->initialized())
    throw ConfigError("tandem: install_cuda_allocator: libtorch's CUDA allocator ('" + current->name() +
                      "') is already initialised: a CUDA tensor, model.to(cuda) or other CUDA work ran before "
                      "this call, and libtorch cannot swap an allocator that may own memory. Call "
                      "install_cuda_allocator() at the start of main(), before any CUDA work.");
}

}  // namespace
}  // namespace tandem::memory

// Entry point for memory/cuda_memory_library.cpp (libtandem, through dlsym). Throws ConfigError,
// having changed nothing, when it cannot install.
extern "C" void tandem_cuda_install_allocator(const tandem::memory::MemoryStackOptions& options,
                                              std::vector<std::shared_ptr<tandem::memory::MemoryStack>>& out) {
  using namespace tandem::memory;
  std::lock_guard<std::mutex> lock(install_mutex());
  const int n = tandem_cuda_memory_device_count();
  check_installable(n);
  auto devices = std::make_shared<Devices>();
  for (int d = 0; d < n; ++d) {
    MemoryStackOptions o = options;
    if (o.pool.name == CachingPoolOptions{}.name) o.pool.name = "cuda:" + std::to_string(d);
    o.stream_events = make_cuda_stream_events(d);
    devices->stacks.push_back(std::make_shared<MemoryStack>(std::make_unique<CudaDeviceBackend>(d), std::move(o)));
  }
  auto allocator = std::make_shared<TandemCudaAllocator>(devices);
  allocator->init(n);
  g_allocator.store(allocator.get(), std::memory_order_release);  // before any tensor can use it
  try {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  } catch (const c10::Error& e) {  // lost a race with libtorch's own initialisation
    g_allocator.store(nullptr, std::memory_order_release);
    throw tandem::ConfigError(std::string("tandem: install_cuda_allocator: libtorch refused the swap: ") +
                              e.what_without_backtrace() + "; call it before any CUDA work.");
  }
  // Paths that ask c10 for "the CUDA allocator" (c10::GetAllocator) must find this one too;
  // libtorch registered its own with priority 0.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), 0);
  g_installed = new std::shared_ptr<TandemCudaAllocator>(allocator);
  out = devices->stacks;
}
