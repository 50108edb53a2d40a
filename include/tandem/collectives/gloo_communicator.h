// Gloo backend of Communicator: CPU tensors over TCP, on libgloo directly; CUDA tensors too,
// staged through pinned host memory as PyTorch's ProcessGroupGloo does (several ranks can then
// share one GPU).
//
// connect_gloo() rendezvouses `size` ranks through a c10d store (TCPStore across processes,
// FileStore, or HashStore for ranks-as-threads in one process) and returns a connected
// communicator. It blocks until every rank arrived; a rank that never arrives makes it throw
// TimeoutError within `options.timeout`, naming the missing ranks.
//
// Dtypes: float32, float64, float16, bfloat16, int8, uint8, int16, int32, int64 (16-bit floats
// are reduced in float and rounded back to their type after each pairwise step). Allreduce picks
// Gloo's bcube algorithm (halving-doubling family, log2(p) steps) below `ring_threshold_bytes`
// on power-of-two groups and the bandwidth-optimal ring otherwise. Non-contiguous tensors are
// copied to a contiguous buffer and the result copied back (see communicator.h).
//
// CUDA tensors: each op copies them into pinned host buffers on a side stream that first waits
// (event) for the caller's current stream, runs on those as on CPU tensors (the same bits), and
// copies the results back on that stream; Work::wait() makes the caller's current stream wait
// (event) for the copies back instead of blocking the host on them. The op keeps the tensors
// alive until its copies finished, so a caller may drop them right after the call. One op's
// tensors must share one device. Only c10's device-agnostic streams and events are used, so
// libtandem links no CUDA library. Costs two PCIe copies and a host wait per op: for tests and
// debugging on one GPU, not for speed (use NCCL).
//
// Shared memory: when every rank of a communicator (sub-groups included) runs on the same host
// and `GlooOptions::shared_memory` is true on all of them, allreduce, reduce-scatter and
// all-gather go through one POSIX shared-memory segment instead of TCP (several times faster and
// far cheaper in CPU); broadcast, barrier and send/recv keep using Gloo. The ranks agree on it at
// connect time through the store; when any rank is elsewhere, disables it, or cannot map the
// segment, every rank keeps Gloo for everything.
// The segment's name is unlinked as soon as all ranks mapped it, so nothing is left in /dev/shm
// even after a SIGKILL (except one that lands inside connect itself). Errors, timeouts and
// abort() behave as on TCP.
//
// Ownership: the store is shared with the caller; the communicator owns its TCP connections, its
// shared-memory segment (if any) and one op thread ("tandem-gloo", started by the first
// collective), joined by the destructor after the queued ops ran (a destructor racing a hung peer
// may block up to the op timeout; call abort() first to return at once).
// Thread-safety: as communicator.h says; collectives run on the op thread in issue order, sends
// and receives are posted on the caller's thread.
// Errors: connect_gloo() throws ConfigError for a rank outside [0, size) or a null store,
// CommError when no TCP device opens on the given hostname/interface or the ranks cannot connect,
// TimeoutError when a rank never arrives; ops fail as communicator.h says, and throw CommError at
// the call for tensors of one op on different devices, a device other than CPU and CUDA, or a
// CUDA tensor libtorch cannot serve here (libtorch_cuda not loaded, no device or driver).
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

struct GlooOptions {
  // Bound on every op, on rendezvous, and on waits without explicit timeout.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Bound on the rendezvous alone when positive. Step-level fault tolerance re-forms a world
  // with ft.quorum_timeout_s here, so a rank that dies while connecting holds the others up that
  // long, not for the op timeout.
  std::chrono::milliseconds connect_timeout{0};
  std::chrono::milliseconds rendezvous_timeout() const {
    return connect_timeout.count() > 0 ? connect_timeout : timeout;
  }
  // Address other ranks use to reach this process (tandem::init derives it from MASTER_ADDR).
  std::string hostname = "127.0.0.1";
  // Network interface to bind (e.g. "eth0"); when set, it wins over `hostname`.
  std::string interface;
  // Keys of this communicator live under this prefix in the store (distinct jobs sharing one store
  // need distinct prefixes).
  std::string store_prefix = "tandem";
  // Allreduce below this many bytes uses bcube on power-of-two groups; ring above.
  size_t ring_threshold_bytes = 256 * 1024;
  // Allreduce, reduce-scatter and all-gather through shared memory when all ranks of the
  // communicator share this host (see the top of this file). Every rank should pass the same
  // value; if any rank passes false, no rank uses shared memory. Off: TCP loopback for
  // everything, as before.
  bool shared_memory = true;
  // Bytes each rank stages per pipeline step of a shared-memory collective (rounded up to 4 KiB);
  // larger tensors go in steps of this size. The segment holds 2 x (ranks + 1) of them, reserved
  // in /dev/shm for the communicator's lifetime (6 MiB for 2 ranks at the default). Rank 0's
  // value is used.
  size_t shared_memory_slot_bytes = 1 << 20;
  // A shared-memory all-gather of at least 1 MiB per rank reads each peer's input straight into
  // the output (process_vm_readv: one copy instead of two through the segment), when every rank
  // may read every peer's memory (same user, no Yama ptrace restriction between siblings, no
  // seccomp filter against the call; probed at connect). False on any rank: two copies.
  bool shared_memory_peer_reads = true;
};

std::shared_ptr<Communicator> connect_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const GlooOptions& options = {});

}  // namespace tandem
