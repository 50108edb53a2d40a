// libtorch integration on the GPU: route every CUDA tensor allocation through tandem's caching
// pool, one MemoryStack per device, with statistics, snapshots and leak tracking as on the host.
// This header includes no torch or CUDA header, and libtandem needs no CUDA library: the work is
// done by libtandem_cuda.so, loaded on first use (like the NCCL communicator).
//
// Ownership: the installed stacks live for the rest of the process (CUDA tensors may outlive any
// owner, libtorch frees some during static destruction); the returned shared_ptrs share them.
// Thread-safety: every function may be called from any thread; installing is serialised.
// Errors: install_cuda_allocator() throws ConfigError (no CUDA part, no device, libtorch's CUDA
// allocator already in use, installed twice, invalid pool options). Allocations through libtorch
// that cannot be satisfied throw c10::OutOfMemoryError carrying tandem's out-of-memory message
// (libtorch's own CUDA code catches that type, e.g. cuDNN's smaller-workspace fallback).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <tandem/memory/memory_stack.h>

namespace tandem::memory {

// True when this build has its CUDA part, libtandem_cuda.so loads and the CUDA runtime sees at
// least one device; otherwise false, with the reason in *why when given. Never throws; touches
// neither libtorch's CUDA state nor its allocator.
bool cuda_allocator_available(std::string* why = nullptr);

// Makes tandem libtorch's CUDA allocator (torch::cuda::CUDAPluggableAllocator, the hook libtorch
// 2.x offers) and returns the stacks serving it, element d for device d:
//   [Tracking] -> [Statistics] -> CrossStreamResource -> CachingPool -> [Limiting]
//     -> CudaDeviceBackend(d)
// built from `options` (the pool's name becomes "cuda:<d>" unless set; stream_events is
// replaced by CUDA events). Semantics are those of libtorch's own caching allocator:
//  - a block freed on a stream is reused only by allocations on that stream;
//  - Tensor::record_stream(s) (c10::cuda::CUDACachingAllocator::recordStream) is honoured: the
//    block returns to the pool only after the work s queued before the free is done;
//  - torch::cuda's emptyCache() releases cached memory, getDeviceStats() and resetPeakStats()
//    read and reset the stack's statistics, cacheInfo() reports its largest free block.
// Must be called before libtorch's first CUDA allocation (in practice at the top of main(),
// before any CUDA tensor, model.to(cuda) or CUDA generator use); otherwise it throws ConfigError
// naming the allocator already in use, and nothing changes. Call it once per process.
// Not supported with it: CUDA graph capture (beginAllocateToPool throws), IPC handles,
// libtorch's allocator snapshots/history (use tandem's take_snapshot() on a stack instead).
// If options.tracking and options.tracking_options.report_at_exit, live allocations of each
// device are reported at process exit. Thread-safe.
std::vector<std::shared_ptr<MemoryStack>> install_cuda_allocator(MemoryStackOptions options = {});

// The stacks installed by install_cuda_allocator() (element d: device d), or empty when it has
// not succeeded in this process. Thread-safe.
std::vector<std::shared_ptr<MemoryStack>> installed_cuda_stacks();

}  // namespace tandem::memory
