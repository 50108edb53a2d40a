#include "collectives/shm/shm_collectives.h"

#include "collectives/kernels/cast_kernels.h"
#include "collectives/kernels/reduce_kernels.h"

#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstring>
#include <functional>

namespace tandem::detail {

namespace {

constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// From this many bytes per rank an all-gather reads the peers' inputs directly. Below it the two
// copies go through slots that stay in cache, and process_vm_readv's page pinning plus the final
// wait for the peers gain nothing (2 MiB per rank on 2 ranks: about equal; docs/collectives.md).
constexpr size_t kPeerReadMinBytes = 1 << 20;

// One channel step of an op: elements [first, first + n) of what the op moves per rank.
struct Segment {
  uint64_t step;
  int buffer;
  size_t first, n;
  uint64_t number, count;  // 1-based, for errors
};

// Runs `body(segment)` for the segments of at most `per` elements that cover `total`, in order.
template <class Body>
void for_each_segment(ShmChannel& ch, size_t total, size_t per, Body&& body) {
  const uint64_t count = (total + per - 1) / per;
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t s = ch.next_step();
    const size_t first = k * per;
    body(Segment{s, static_cast<int>(s & 1), first, std::min(per, total - first), k + 1, count});
  }
}

// Divides `n` elements at `p` (of `like`'s dtype) by `divisor` in place: the avg of the Gloo path.
void divide(char* p, size_t n, const at::Tensor& like, int divisor) {
  at::from_blob(p, {static_cast<int64_t>(n)}, like.options()).div_(divisor);
}

}  // namespace

ShmCollectives::ShmCollectives(std::unique_ptr<ShmChannel> channel)
    : channel_(std::move(channel)) {}

// How an allreduce's elements move between the caller's tensor and the segment.
struct ShmCollectives::Transfer {
  size_t user_size;  // bytes per element in the caller's tensor
  size_t wire_size;  // bytes per element in the segment
  // `n` elements from the tensor into the segment, and from the segment into the tensor.
  std::function<void(const char* from, char* to, size_t n)> in, out;
  bool plain;  // in and out are copies: the reduction reads this rank's chunk from the tensor
};

void ShmCollectives::allreduce(const at::Tensor& buffer, ReduceOp op, uint64_t op_seq) {
  const size_t esize = buffer.element_size();
  auto copy = [esize](const char* from, char* to, size_t n) { std::memcpy(to, from, n * esize); };
  run_allreduce(buffer, buffer.scalar_type(), op, Transfer{esize, esize, copy, copy, true},
                op_seq);
}

void ShmCollectives::allreduce_narrowed(const at::Tensor& buffer, at::ScalarType wire,
                                        float divisor, uint64_t op_seq) {
  const kernels::CastKernels& k = kernels::cast_kernels();
  const auto narrow = wire == at::kHalf ? k.to_half : k.to_bf16;
  const auto widen = wire == at::kHalf ? k.from_half : k.from_bf16;
  const Transfer t{
      sizeof(float), sizeof(uint16_t),
      [narrow, divisor](const char* f, char* to, size_t n) {
        narrow(reinterpret_cast<const float*>(f), reinterpret_cast<uint16_t*>(to), n, divisor);
      },
      [widen](const char* f, char* to, size_t n) {
        widen(reinterpret_cast<const uint16_t*>(f), reinterpret_cast<float*>(to), n);
      },
      false};
  run_allreduce(buffer, wire, ReduceOp::kSum, t, op_seq);
}

void ShmCollectives::run_allreduce(const at::Tensor& buffer, at::ScalarType wire, ReduceOp op,
                                   const Transfer& t, uint64_t op_seq) {
  ShmChannel& ch = *channel_;
  const int size = ch.size();
  const int rank = ch.rank();
  const size_t numel = static_cast<size_t>(buffer.numel());
  const ReduceFn fn = reduce_kernel(wire, op);
  // The op's identity is what travels: a narrowed op matches a plain one of the wire dtype.
  ch.begin_op({ShmOpIdentity::kAllreduce, op_seq, numel * t.wire_size, wire,
               static_cast<int32_t>(op)});
  if (numel == 0) return;

  char* const base = static_cast<char*>(buffer.data_ptr());
  const size_t ws = t.wire_size;
  const size_t align = 64 / ws;  // chunk boundaries on cache lines: no false sharing
  for_each_segment(ch, numel, ch.slot_bytes() / ws, [&](const Segment& g) {
    const int b = g.buffer;
    const size_t n = g.n;
    const size_t chunk = round_up((n + size - 1) / size, align);
    const size_t lo = std::min(n, rank * chunk);
    const size_t hi = std::min(n, (rank + 1) * chunk);
    char* const src = base + g.first * t.user_size;
    char* const mine = ch.slot(b, rank);
    char* const result = ch.slot(b, size);

    // 1. Contribute: the peers need every chunk but ours.
    t.in(src, mine, lo);
    t.in(src + hi * t.user_size, mine + hi * ws, n - hi);
    ch.arrive(g.step, g.number, g.count);

    // 2. Reduce chunk `rank` over ranks 0..size-1, in that order, into the result area. Our own
    // part is read from the tensor, or narrowed into our slot (where no peer reads) first.
    if (hi > lo) {
      const size_t off = lo * ws;
      if (!t.plain) t.in(src + lo * t.user_size, mine + off, hi - lo);
      auto input = [&](int q) -> const char* {
        return q == rank && t.plain ? src + off : ch.slot(b, q) + off;
      };
      fn(result + off, input(0), input(1), hi - lo);
      for (int q = 2; q < size; ++q) fn(result + off, result + off, input(q), hi - lo);
      if (op == ReduceOp::kAvg) divide(result + off, hi - lo, buffer, size);
    }
    // The result area is whole only once every rank reduced its chunk: this wait is not optional.
    ch.done(g.step, /*wait=*/true, g.number, g.count);

    // 3. Everyone's chunks, ours included, back into the tensor.
    t.out(result, src, n);
  });
}

bool ShmCollectives::reduce_scatter_fits(size_t element_size) const {
  return channel_->slot_bytes() / static_cast<size_t>(channel_->size()) >= 64 &&
         element_size <= 64;
}

void ShmCollectives::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op, uint64_t op_seq) {
  ShmChannel& ch = *channel_;
  const int size = ch.size();
  const int rank = ch.rank();
  const size_t es = output.element_size();
  const size_t m = static_cast<size_t>(output.numel());  // elements per rank's chunk
  const ReduceFn fn = reduce_kernel(output.scalar_type(), op);
  ch.begin_op({ShmOpIdentity::kReduceScatter, op_seq, m * size * es, output.scalar_type(),
               static_cast<int32_t>(op)});
  if (m == 0) return;

  // A slot is `size` sub-slots of `per` elements, one per destination rank, on cache lines.
  const size_t align = 64 / es;
  const size_t per = ch.slot_bytes() / size / es / align * align;
  const char* const in = static_cast<const char*>(input.data_ptr());
  char* const out = static_cast<char*>(output.data_ptr());
  for_each_segment(ch, m, per, [&](const Segment& g) {
    const size_t first = g.first, n = g.n;
    char* const mine = ch.slot(g.buffer, rank);

    // 1. Our part of every other rank's chunk into its sub-slot of our slot.
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      std::memcpy(mine + q * per * es, in + (q * m + first) * es, n * es);
    }
    ch.arrive(g.step, g.number, g.count);

    // 2. Our chunk over ranks 0..size-1 (ours straight from the input), into the output.
    auto part = [&](int q) -> const char* {
      return q == rank ? in + (rank * m + first) * es : ch.slot(g.buffer, q) + rank * per * es;
    };
    char* const dst = out + first * es;
    fn(dst, part(0), part(1), n);
    for (int q = 2; q < size; ++q) fn(dst, dst, part(q), n);
    if (op == ReduceOp::kAvg) divide(dst, n, output, size);
    ch.done(g.step, /*wait=*/false, g.number, g.count);
  });
}

void ShmCollectives::allgather(const at::Tensor& output, const at::Tensor& input,
                               uint64_t op_seq) {
  ShmChannel& ch = *channel_;
  const int size = ch.size();
  const int rank = ch.rank();
  const size_t es = input.element_size();
  const size_t m = static_cast<size_t>(input.numel());
  const char* in = static_cast<const char*>(input.data_ptr());
  char* const out = static_cast<char*>(output.data_ptr());
  // Every rank takes the same path: `m * es` is the same everywhere (arrive() checks it).
  if (ch.reads_peers() && m * es >= kPeerReadMinBytes) {
    const size_t bytes = m * es;
    char* const ours = out + rank * bytes;
    // Peers read our input while we write our output: an input that overlaps the output (other
    // than as exactly our own chunk) is read from a private copy.
    at::Tensor staged;
    if (in != ours && in < out + size * bytes && out < in + bytes) {
      staged = input.clone();
      in = static_cast<const char*>(staged.data_ptr());
    }
    ch.begin_op({ShmOpIdentity::kAllgather, op_seq, bytes, input.scalar_type(), -1, in});
    const uint64_t s = ch.next_step();
    ch.arrive(s, 1, 1);
    for (int q = 0; q < size; ++q) {
      if (q != rank) ch.read_peer(q, out + q * bytes, bytes);
    }
    if (ours != in) std::memcpy(ours, in, bytes);
    // Our input must stay as it is until every peer has read it.
    ch.done(s, /*wait=*/true, 1, 1);
    return;
  }

  ch.begin_op({ShmOpIdentity::kAllgather, op_seq, m * es, input.scalar_type(), -1});
  if (m == 0) return;
  for_each_segment(ch, m, ch.slot_bytes() / es, [&](const Segment& g) {
    const size_t first = g.first, n = g.n;
    std::memcpy(ch.slot(g.buffer, rank), in + first * es, n * es);
    ch.arrive(g.step, g.number, g.count);
    for (int q = 0; q < size; ++q) {
      const char* from = q == rank ? in + first * es : ch.slot(g.buffer, q);
      char* to = out + (q * m + first) * es;
      if (to != from) std::memcpy(to, from, n * es);  // equal: the input is our output chunk
    }
    ch.done(g.step, /*wait=*/false, g.number, g.count);
  });
}

}  // namespace tandem::detail
