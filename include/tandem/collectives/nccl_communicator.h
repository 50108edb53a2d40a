// NCCL backend of Communicator: CUDA tensors. Built when CMake finds the CUDA toolkit and NCCL,
// into its own library, libtandem_cuda.so (target tandem::cuda, which defines TANDEM_HAVE_NCCL);
// libtandem.so needs no CUDA library: these two functions load libtandem_cuda on first use.
//
// connect_nccl() exchanges NCCL's unique id through the c10d store (rank 0 creates it) and
// initialises one NCCL communicator on `options.device`. CUDA streams are ordered as in c10d's
// ProcessGroupNCCL:
//  - Producer: an op runs on the communicator's NCCL stream (one of libtorch's pool streams), which
//    first waits, by an event, for the work queued so far on the calling thread's current stream
//    of that device (c10::cuda::getCurrentCUDAStream). Produce the inputs on any stream and make
//    it current (c10::cuda::CUDAStreamGuard) when calling the op.
//  - Consumer: Work::wait() makes the calling thread's current stream wait for the op's end event
//    and returns without blocking the host; work queued on that stream afterwards sees the result,
//    and a host read (.item(), .cpu()) synchronises with that stream as usual. wait(timeout) with
//    an explicit timeout also blocks the host until the op is done (or throws TimeoutError).
//    is_completed() and completed_at() never block.
//  - Lifetime: every tensor an op reads or writes (with the contiguous copies of non-contiguous
//    ones) is recordStream'd on the NCCL stream and referenced by the op until its end event, so
//    the caller may drop its tensors right after the call; it must not write them before wait().
//    A non-contiguous output is filled by a copy on the NCCL stream, before the end event.
//  - Failures: a watchdog thread per communicator polls the ops' events and
//    ncclCommGetAsyncError. An op not done `options.timeout` after it was issued fails with
//    TimeoutError naming the op, this rank and `--set comm.timeout_s`; an NCCL async error fails
//    the oldest op with PeerLostError. Either way the communicator is aborted (ncclCommAbort) and
//    broken: its other pending ops fail, and the failure surfaces at the next wait() or op on it.
//
// Differences from Gloo: send/recv match per peer in posting order; `tag` must be 0 (NCCL has no
// tags). int16 is not supported. Sub-groups use ncclCommSplit.
//
// Ownership: shares the store; owns the NCCL communicator and its watchdog thread (joined by the
// destructor, which first lets pending ops end or time out); a Work owns its events and keeps its
// communicator alive.
// Thread-safety: as in communicator.h.
// Errors: connect_nccl() throws ConfigError when libtandem_cuda cannot be loaded (a build without
// CUDA, or no CUDA runtime or NCCL on this machine), for a bad rank, CUDA device or timeout,
// TimeoutError when rank 0's unique id never arrives, CommError when CUDA or NCCL fail; ops throw
// CommError for tensors off the communicator's device, unsupported dtypes or a non-zero tag, and
// fail as communicator.h says (TimeoutError past the timeout, after aborting NCCL).
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
  // Every op must be done this long after it was issued (comm.timeout_s in tandem::init); > 0.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Bound on waiting for rank 0's unique id when positive (else `timeout`); see GlooOptions.
  std::chrono::milliseconds connect_timeout{0};
  std::chrono::milliseconds rendezvous_timeout() const {
    return connect_timeout.count() > 0 ? connect_timeout : timeout;
  }
  int device = 0;                  // CUDA device index (usually LOCAL_RANK)
  std::string store_prefix = "tandem";
};

// CUDA devices this process can use (0 without libtandem_cuda, the CUDA runtime, a driver or a
// device).
int cuda_device_count();

std::shared_ptr<Communicator> connect_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const NcclOptions& options = {});

}  // namespace tandem
