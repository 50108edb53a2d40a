// Internal: the shared-memory segment and step protocol under tandem's shared-memory collectives
// (shm_collectives.h runs allreduce, reduce-scatter and all-gather over it).
//
// connect_shm_channel() is collective over the ranks of a communicator: each rank publishes its
// host identity (host name + kernel boot id, or "off" when ShmChannelOptions::enabled is false)
// under the communicator's store prefix; when all are equal and none is "off", rank 0 creates one
// shared segment, the others map it, and the name is unlinked as soon as everyone has mapped it.
// Then each rank probes whether it can read every peer's memory (peer_memory.h); only when all can
// (and ShmChannelOptions::peer_reads is true everywhere) does the channel offer
// read_peer(), which the all-gather uses to copy each element once.
// Any failure on any rank (different hosts, no shared /dev/shm, /dev/shm full) makes every rank
// return nullptr: the caller keeps using Gloo, and all ranks agree because the decision is read
// from the same store keys. When the hosts match but the segment cannot be created or mapped,
// rank 0 prints one line to stderr saying why.
//
// Segment layout (all offsets fixed at creation, identical on every rank):
//   Header     magic, geometry, the futex word `epoch`, the sleeper count, the abort word (who
//              stopped the communicator and why: abort() or mismatched collectives)
//   RankBlock  one per rank, 128-byte aligned: `progress` (the rank's step counter) and the
//              identity of its current op (kind, sequence number, bytes, dtype, reduce op), with
//              the address of its input where peers read it directly
//   data       2 buffers x (size slots + 1 result area), each `slot_bytes`
//
// Steps: every op is cut into steps; step s (numbered across ops, the same on every rank) uses
// buffer s % 2. A rank publishes progress 2s-1 once its slot holds its contribution to step s
// ("arrived") and 2s once it is done reading step s ("done"). An op writes buffer s % 2 only
// after every rank arrived at step s-1, which each did after it was done with step s-2: so two
// buffers need no third wait. After the first "arrived" of an op every rank compares the peers'
// op identity with its own and stops the communicator (CommError on all ranks) if they differ,
// instead of mixing unrelated data.
//
// Waiting: spin 20 us on the peers' progress, then sleep on the futex word (publishers wake
// sleepers), in slices of at most 10 ms so each wait also notices the abort word, a peer that
// closed its communicator, a peer whose process is gone (its OFD presence lock was released) and
// the op timeout.
//
// Thread-safety: one op thread runs the steps; abort() may be called from any thread.
#pragma once

#include "collectives/shm/shm_segment.h"

#include <tandem/collectives/communicator.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::detail {

struct Header;
struct RankBlock;

// What an op is, as the peers compare it. `reduce` is a ReduceOp, or -1 for ops without one.
struct ShmOpIdentity {
  enum Kind : int32_t { kAllreduce = 1, kReduceScatter = 2, kAllgather = 3 };
  Kind kind;
  uint64_t seq;
  uint64_t bytes;  // on the wire, per rank
  at::ScalarType dtype;
  int32_t reduce;
  const void* source = nullptr;  // where peers read this rank's input (read_peer); not compared
};

class ShmChannel {
 public:
  // `peer_pids`: every rank's process id when this rank may read each peer's memory, else empty.
  ShmChannel(ShmSegment segment, int rank, int size, size_t slot_bytes,
             std::vector<int> world_ranks, std::chrono::milliseconds timeout,
             std::vector<int> peer_pids = {});
  // Tells the peers this rank left (a peer still waiting on it fails at once) and unmaps.
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Slot `r` of buffer `buffer`; r == size() is the buffer's result area.
  char* slot(int buffer, int r) const;

  // Starts an op: throws CommError if the communicator was stopped, and records `op` for the
  // peers' check in arrive().
  void begin_op(const ShmOpIdentity& op);
  // The next step number (buffer: step & 1).
  uint64_t next_step() { return ++step_; }
  // Publishes "arrived at step s" and waits until every rank did; on the op's first step
  // (`segment` 1) checks that every rank runs the same op. `segment`/`segments` go into errors.
  void arrive(uint64_t s, uint64_t segment, uint64_t segments);
  // Publishes "done with step s"; with `wait`, also waits until every rank is.
  void done(uint64_t s, bool wait, uint64_t segment, uint64_t segments);

  // Whether read_peer() works: every rank can read every peer's memory (decided at connect).
  bool reads_peers() const { return !peer_pids_.empty(); }
  // Copies `bytes` from the `source` that rank `q` gave its op in flight into `to`; only after
  // arrive() on the op's first step, and only while q has not published "done" for it. On
  // failure stops the communicator on every rank and throws (peer_memory.h).
  void read_peer(int q, void* to, size_t bytes);

  // Any thread, any time: fails the in-flight and every later op on every rank.
  void abort();

  // Total segment bytes for `size` ranks with `slot_bytes` per slot.
  static size_t segment_bytes(int size, size_t slot_bytes);

 private:
  // First rank whose progress is below `target`, or -1.
  int first_behind(uint64_t target) const;
  // Until every rank's progress reached `target`; `what` and the segment numbers go into errors.
  void wait_progress(uint64_t target, const char* what, uint64_t segment, uint64_t segments);
  std::string abort_reason(uint32_t abort_word) const;
  void publish(uint64_t progress);
  void check_same_op() const;
  std::string rank_name(int r) const;

  ShmSegment segment_;
  const int rank_;
  const int size_;
  const size_t slot_bytes_;
  const std::vector<int> world_ranks_;
  const std::chrono::milliseconds timeout_;
  const std::vector<int> peer_pids_;
  Header* header_;
  RankBlock* ranks_;
  char* data_;
  uint64_t step_ = 0;  // last step this rank started (same on every rank)
  int op_parity_ = 0;  // which of the two op records the op in flight uses
  const char* op_name_ = "collective";  // of the op in flight, for errors
};

// How a channel is set up; the communicator that owns it fills these from its own options.
struct ShmChannelOptions {
  bool enabled = true;          // false on any rank: no rank uses shared memory
  size_t slot_bytes = 1 << 20;  // per rank and step (rounded up to 4 KiB); rank 0's value is used
  bool peer_reads = true;       // false on any rank: no peer reads (two copies per all-gather)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};     // every wait for a peer
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};  // the setup's waits
  // Named in the warning printed when the ranks share a host but not memory.
  std::string disable_hint = "ShmChannelOptions::enabled = false";
};

// Collective (see the top of this file). `store` is the communicator's store, `prefix` its key
// prefix; returns nullptr when shared memory is off or cannot be used by every rank. Throws
// TimeoutError when a rank does not take part within options.rendezvous_timeout.
std::unique_ptr<ShmChannel> connect_shm_channel(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& prefix, int rank,
                                                const std::vector<int>& world_ranks,
                                                const ShmChannelOptions& options);

// "<host name>/<boot id>": equal exactly for processes on one running machine.
std::string shm_host_identity();

}  // namespace tandem::detail
