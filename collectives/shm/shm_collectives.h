// Internal: allreduce, reduce-scatter and all-gather through POSIX shared memory between the ranks
// of one host, over the steps of a ShmChannel (shm_channel.h: segment, synchronisation, errors).
//
// Every op cuts its tensor into segments that fit a slot; each segment is one channel step.
//   allreduce      segment k is cut into `size` chunks (64-byte aligned). Rank r copies every
//                  chunk but its own into its slot and arrives; reduces chunk r over ranks
//                  0, 1, ..., size-1 in that fixed order (its own contribution read straight from
//                  its tensor) into the result area, divides there for avg, and is done; after
//                  every rank is done it copies the whole result area into its tensor.
//   reduce_scatter a slot holds `size` sub-slots; rank r copies its part of every other rank's
//                  output chunk into theirs and arrives; then reduces its own output chunk over
//                  ranks 0..size-1, in that order, straight into its output, and is done.
//   allgather      rank r copies its input segment into its slot and arrives; then copies every
//                  rank's slot (its own from its input) into its output, and is done. From
//                  1 MiB per rank, when the channel reads_peers(), in one step instead: rank r
//                  publishes its input's address and arrives, reads each peer's input straight
//                  into its output (one copy, not two), and waits until every rank is done
//                  reading its input before returning.
// Every element is reduced by exactly one rank, in rank order: all ranks hold the same bits, and
// the reduce-scatter's chunks are bitwise the allreduce's. The reduce-scatter and the slot path
// of the all-gather end without waiting for the peers (the next op's first write goes to the
// other buffer).
// allreduce_narrowed() runs the allreduce on a float32 tensor whose values travel as float16 or
// bfloat16: the copy in narrows, the rank's own chunk is narrowed into its slot, the copy out
// widens.
//
// Threading: one op thread at a time (the communicator's); abort() from any thread.
// Errors (every op): TimeoutError when a wait for a peer outlasts the timeout; CommError when a
// peer left, died, issued a different op (kind, sequence number, bytes, dtype or reduce op differ),
// or the communicator was aborted.
#pragma once

#include "collectives/shm/shm_channel.h"

#include <tandem/collectives/communicator.h>

#include <memory>

namespace tandem::detail {

class ShmCollectives {
 public:
  explicit ShmCollectives(std::unique_ptr<ShmChannel> channel);

  // In place over the contiguous CPU tensor `buffer` (every rank the same numel and dtype); avg
  // divides by the group size. `op_seq` is the communicator's sequence number of the op.
  void allreduce(const at::Tensor& buffer, ReduceOp op, uint64_t op_seq);

  // Sum of the contiguous float32 `buffer` with the values travelling as `wire` (kHalf or
  // kBFloat16): the bits of allreduce(kSum) over the wire copy (buffer / divisor).to(wire),
  // widened back into `buffer`, without the copy. To the peers it is that op on the wire dtype.
  void allreduce_narrowed(const at::Tensor& buffer, at::ScalarType wire, float divisor,
                          uint64_t op_seq);

  // Contiguous `input` (size() * output.numel() elements) reduced over ranks; this rank's chunk
  // into the contiguous `output` (same dtype). Only where reduce_scatter_fits().
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                      uint64_t op_seq);
  // Whether a slot holds a cache line per rank for elements of `element_size` bytes (false only
  // for tiny slots shared by many ranks; the same answer on every rank).
  bool reduce_scatter_fits(size_t element_size) const;

  // Contiguous `input` of every rank into the contiguous `output` (size() * input.numel()
  // elements, rank r's at [r * input.numel(), (r + 1) * input.numel())).
  void allgather(const at::Tensor& output, const at::Tensor& input, uint64_t op_seq);

  void abort() { channel_->abort(); }
  int size() const { return channel_->size(); }

 private:
  struct Transfer;
  // The allreduce, for `buffer` whose elements travel as `wire` through `t`.
  void run_allreduce(const at::Tensor& buffer, at::ScalarType wire, ReduceOp op,
                     const Transfer& t, uint64_t op_seq);

  std::unique_ptr<ShmChannel> channel_;
};

}  // namespace tandem::detail
