// NCCL backend of Communicator: CUDA tensors. Built when CMake finds the CUDA toolkit and NCCL,
// into its own library, libtandem_cuda.so (target tandem::cuda, which defines TANDEM_HAVE_NCCL);
// libtandem.so needs no CUDA library: these two functions load libtandem_cuda on first use.
//
// connect_nccl() exchanges NCCL's unique id through the c10d store (rank 0 creates it) and
// initialises one NCCL communicator on `options.device`. Ops run on a private stream that first
// waits for work queued on `options.input_stream` (default: the legacy default stream, which is
// libtorch's default), so tensors produced by earlier kernels are ready. Work::wait() polls the
// op's completion event and NCCL's async error; past the timeout it aborts the NCCL communicator
// (ncclCommAbort) and throws TimeoutError, so a hung peer never hangs the caller.
//
// Differences from Gloo: send/recv match per peer in posting order; `tag` must be 0 (NCCL has no
// tags). int16 is not supported. Sub-groups use ncclCommSplit.
//
// Ownership: shares the store; owns the NCCL communicator and its private stream (destroyed with
// it); a Work owns its completion event.
// Thread-safety: as in communicator.h.
// Errors: connect_nccl() throws ConfigError when libtandem_cuda cannot be loaded (a build without
// CUDA, or no CUDA runtime or NCCL on this machine), for a bad rank or CUDA device, TimeoutError when
// rank 0's unique id never arrives, CommError when CUDA or NCCL fail; ops throw CommError for
// tensors off the device, unsupported dtypes or a non-zero tag, and fail as communicator.h says
// (TimeoutError past the timeout, after aborting the NCCL communicator).
#pragma once

#include <tandem/collectives/communicator.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

namespace c10d {
class Store;
}

namespace tandem {

struct NcclOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  int device = 0;                  // CUDA device index (usually LOCAL_RANK)
  void* input_stream = nullptr;    // cudaStream_t whose work ops wait for; null = legacy default
  std::string store_prefix = "tandem";
};

// CUDA devices this process can use (0 without libtandem_cuda, the CUDA runtime, a driver or a
// device).
int cuda_device_count();

std::shared_ptr<Communicator> connect_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const NcclOptions& options = {});

}  // namespace tandem
