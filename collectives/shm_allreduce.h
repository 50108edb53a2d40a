// Internal: allreduce through POSIX shared memory between the ranks of one host.
//
// connect_shm_allreduce() is collective over the ranks of a communicator: each rank publishes its
// host identity (host name + kernel boot id, or "off" when GlooOptions::shared_memory is false)
// under the communicator's store prefix; when all are equal and none is "off", rank 0 creates one
// shared segment, the others map it, and the name is unlinked as soon as everyone has mapped it.
// Any failure on any rank (different hosts, no shared /dev/shm, /dev/shm full) makes every rank
// return nullptr: the caller keeps using Gloo, and all ranks agree because the decision is read
// from the same store keys. When the hosts match but the segment cannot be created or mapped,
// rank 0 prints one line to stderr saying why.
//
// Segment layout (all offsets fixed at creation, identical on every rank):
//   Header     magic, geometry, the futex word `epoch`, the sleeper count, the abort word (who
//              stopped the communicator and why: abort() or mismatched collectives)
//   RankBlock  one per rank, 128-byte aligned: `progress` (the rank's step counter) and the
//              identity of its current op (sequence number, bytes, dtype, reduce op)
//   data       2 buffers x (size slots + 1 result area), each `slot_bytes`
//
// Algorithm: a tensor is cut into segments of at most slot_bytes; segment k (global step s, buffer
// s % 2) is cut into `size` chunks (64-byte aligned). Rank r
//   1. copies every chunk but its own into its slot, then publishes progress = 2s-1 ("arrived");
//   2. waits until every rank arrived, reduces chunk r over ranks 0, 1, ..., size-1 in that fixed
//      order (its own contribution read straight from its tensor) into the result area, divides
//      there for avg, and publishes progress = 2s ("reduced");
//   3. waits until every rank reduced and copies the whole result area into its tensor.
// allreduce_narrowed() runs the same steps on a float32 tensor whose values travel as float16 or
// bfloat16: step 1 narrows instead of copying, step 2 first narrows the rank's own chunk into its
// slot, step 3 widens.
// After the first "arrived" of an op every rank compares the peers' op identity with its own and
// stops the communicator (CommError on all ranks) if they differ, instead of mixing unrelated
// data. Every element is reduced by exactly one rank, so all ranks hold the same bits. Buffer reuse
// needs no third wait: rank q reaching "reduced" at step s+1 implies it finished copying out
// step s, and everyone waits for that before touching buffer s % 2 again at step s+2.
//
// Waiting: spin 20 us on the peers' progress, then sleep on the futex word (publishers wake
// sleepers), in slices of at most 10 ms so each wait also notices the abort word, a peer that
// closed its communicator, a peer whose process is gone (its OFD presence lock was released) and
// the op timeout.
#pragma once

#include "collectives/shm_segment.h"

#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

namespace detail {
struct Header;
struct RankBlock;
}  // namespace detail

class ShmAllreduce {
 public:
  ShmAllreduce(ShmSegment segment, int rank, int size, size_t slot_bytes,
               std::vector<int> world_ranks, std::chrono::milliseconds timeout);
  // Tells the peers this rank left (a peer still waiting on it fails at once) and unmaps.
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // In place over the contiguous CPU tensor `buffer` (every rank the same numel and dtype); avg
  // divides by size(). Runs on one thread at a time (the op thread). Throws TimeoutError when a
  // wait for a peer outlasts the timeout, CommError when a peer left, died, issued a different
  // allreduce (`op_seq`, bytes, dtype or op differ), or the communicator was aborted.
  void allreduce(const at::Tensor& buffer, ReduceOp op, uint64_t op_seq);

  // Sum of the contiguous float32 `buffer` with the values travelling as `wire` (kHalf or
  // kBFloat16): the bits of allreduce(kSum) over the wire copy (buffer / divisor).to(wire),
  // widened back into `buffer`, without the copy: the casts happen on the way into and out of
  // the segment. To the peers it is that op on the wire dtype. Errors as allreduce().
  void allreduce_narrowed(const at::Tensor& buffer, at::ScalarType wire, float divisor,
                          uint64_t op_seq);

  // Any thread, any time: fails the in-flight and every later allreduce on every rank.
  void abort();

  size_t slot_bytes() const { return slot_bytes_; }

  // Total segment bytes for `size` ranks with `slot_bytes` per slot.
  static size_t segment_bytes(int size, size_t slot_bytes);

 private:
  struct Transfer;
  // The algorithm, for `buffer` whose elements travel as `wire` through `t`.
  void run(const at::Tensor& buffer, at::ScalarType wire, ReduceOp op, const Transfer& t,
           uint64_t op_seq);
  // First rank whose progress is below `target`, or -1.
  int first_behind(uint64_t target) const;
  // Until every rank's progress reached `target`; `what` and the segment numbers go into errors.
  void wait_progress(uint64_t target, const char* what, uint64_t segment, uint64_t segments);
  std::string abort_reason(uint32_t abort_word) const;
  void publish(uint64_t progress);
  void check_same_op(uint64_t op_seq, uint64_t bytes, int dtype, int op) const;
  std::string rank_name(int r) const;
  char* slot(int buffer, int r) const;

  ShmSegment segment_;
  const int rank_;
  const int size_;
  const size_t slot_bytes_;
  const std::vector<int> world_ranks_;
  const std::chrono::milliseconds timeout_;
  detail::Header* header_;
  detail::RankBlock* ranks_;
  char* data_;
  uint64_t step_ = 0;  // last step this rank started (same on every rank)
};

// Collective (see the top of this file). `store` is the communicator's store, `prefix` its key
// prefix; returns nullptr when shared memory is off or cannot be used by every rank. Throws
// TimeoutError when a rank does not take part within options.timeout.
std::unique_ptr<ShmAllreduce> connect_shm_allreduce(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::string& prefix, int rank,
                                                    const std::vector<int>& world_ranks,
                                                    const GlooOptions& options);

// "<host name>/<boot id>": equal exactly for processes on one running machine.
std::string shm_host_identity();

}  // namespace tandem
