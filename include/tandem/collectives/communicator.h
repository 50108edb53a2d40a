// Communicator: the one interface every parallel wrapper in tandem talks to.
//
// A Communicator connects `size()` ranks; this process is `rank()`. Every op is asynchronous: it
// validates its arguments at once (bad input throws CommError from the call itself, before anything
// is sent), then returns a Work handle. `Work::wait()` blocks until the op is done and rethrows its
// error; a wait that outlasts its timeout throws TimeoutError naming the op, its sequence number,
// size, the ranks and the elapsed time. A hung or dead peer is therefore an error, never a hang.
//
// Ordering: collectives run in issue order (one queue per communicator), so ranks must issue
// collectives in the same order. send/recv are posted in issue order and matched per
// (peer, tag) in posting order; they may complete while earlier collectives still run. Where
// p2p_tags() is false (NCCL) there are no tags: a pair's ops match in posting order only, each
// may block its queue until the peer posts its match, and send_recv() posts a batch that
// progresses together (a send and a receive between two peers that each post the send first
// would otherwise deadlock).
//
// Tensors: inputs may be non-contiguous: the op works on a contiguous copy and copies results
// back into the caller's tensor (costs one extra copy each way). In-place ops write their
// result into the given tensor only when the op has completed (wait() returned). The caller must
// keep tensors alive and untouched until then.
//
// After any communication failure (peer died, timeout) the communicator is broken: every later op
// fails at once with CommError carrying the first failure. Create a new one to continue (the
// fault-tolerant launcher restarts the whole group instead).
//
// Ownership: communicators are shared (std::shared_ptr); a sub-group from new_group()/split() is a
// communicator of its own, independent of its parent's lifetime. Work handles are shared; the
// caller owns the tensors and keeps them alive and untouched until wait() returned.
// Thread-safety: all methods may be called from any thread; issue order is the order in which
// calls entered the communicator. A Work handle is used by one thread at a time.
// Errors: CommError from the call for bad arguments (wrong device, dtype, size, rank or tag), and
// from wait() or any later op after a peer failed; TimeoutError from wait() past its timeout.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

enum class ReduceOp { kSum, kAvg, kMin, kMax, kProduct };

// "sum", "avg", ... (also accepted by parse_reduce_op; anything else is a ConfigError).
const char* to_string(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& name);

// Handle of one asynchronous op.
class Work {
 public:
  // A wait without an explicit timeout uses the communicator's op timeout.
  static constexpr std::chrono::milliseconds kDefaultTimeout{-1};

  virtual ~Work() = default;

  // Blocks until the op completes; rethrows the op's error (CommError/TimeoutError). Throws
  // TimeoutError when `timeout` passes first; the op then stays in flight and the communicator is
  // marked broken. Calling wait() again after success returns at once.
  virtual void wait(std::chrono::milliseconds timeout = kDefaultTimeout) = 0;

  // True once the op finished (successfully or not) without blocking. For send/recv, which
  // complete in the transport, this becomes true only after wait() returned.
  virtual bool is_completed() = 0;

  // Human-readable description, e.g. "allreduce #12 (sum, 4.00 MiB float32) on ranks [0, 1]".
  virtual std::string describe() const = 0;

  // When the op completed (steady clock) once it has, for timelines; nullopt while in flight, or
  // where the backend cannot tell (the caller then uses the moment its wait returned).
  virtual std::optional<std::chrono::steady_clock::time_point> completed_at() { return std::nullopt; }
};

using WorkPtr = std::shared_ptr<Work>;

// One point-to-point op of a batch (Communicator::send_recv).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  at::Tensor tensor;
  int peer = 0;
  uint32_t tag = 0;
};

// An optional capability of a communicator (Communicator::narrowed_allreduce()): the sum of a
// float32 tensor whose values travel as `wire` (kHalf, kBFloat16), each rank sending
// (tensor / divisor) rounded, the casts fused into the transport (shared memory). Returns null for
// a call it cannot take that way (another op path, a tensor that is not contiguous float32): the
// caller then casts itself; the same op goes on the wire, so ranks may differ in which they take.
class NarrowedAllreduce {
 public:
  virtual WorkPtr allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire, int divisor) = 0;

 protected:
  ~NarrowedAllreduce() = default;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Rank of this process in the communicator, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Name of the backend ("gloo", "nccl").
  virtual std::string backend() const = 0;
  // Rank in the world communicator of group rank `group_rank` (used in error messages).
  virtual int world_rank(int group_rank) const = 0;
  // Timeout applied to every op and to waits without an explicit timeout.
  virtual std::chrono::milliseconds timeout() const = 0;

  // The operations are non-virtual: each checks what every backend requires of its arguments
  // (an allocated dense tensor of a supported dtype, a reduce op its dtype allows, sizes that fit
  // the world, peers in range: CommError naming the op and the argument) and then hands the op
  // to the backend's do_* hook below, which checks what only it knows (the device), and numbers
  // and records the op through issue().

  // In place: every rank's `tensor` becomes the reduction over all ranks. kAvg is defined for
  // floating types only (integer averages would silently truncate).
  WorkPtr allreduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  // In place: every rank's `tensor` becomes root's.
  WorkPtr broadcast(const at::Tensor& tensor, int root);

  // `output` (numel == size() * input.numel(), same dtype) receives every rank's `input`,
  // rank r's at elements [r * input.numel(), (r + 1) * input.numel()).
  WorkPtr allgather(const at::Tensor& output, const at::Tensor& input);

  // `input` (numel == size() * output.numel()) is reduced over ranks; rank r's `output` receives
  // elements [r * output.numel(), (r + 1) * output.numel()) of the reduction.
  WorkPtr reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                         ReduceOp op = ReduceOp::kSum);

  // Point to point, matched by (peer, tag) in posting order. Sizes and dtypes must agree.
  WorkPtr send(const at::Tensor& tensor, int dst, uint32_t tag = 0);
  WorkPtr recv(const at::Tensor& tensor, int src, uint32_t tag = 0);

  // Whether send/recv of tensors on `device` match by tag (Gloo, shared memory: true) or only in
  // posting order per peer, refusing any tag but 0 (NCCL: false). A caller that posts one pair's
  // ops out of order, or receives ahead of time, needs tags.
  virtual bool p2p_tags(c10::Device device) const {
    (void)device;
    return true;
  }

  // Posts `ops` (each as send() or recv() would, same checks) as one batch that progresses
  // together: one NCCL group; elsewhere one by one, in order. The Work completes when every op
  // did; its wait() rethrows the first op's error.
  WorkPtr send_recv(const std::vector<P2POp>& ops);

  WorkPtr barrier();

  // A Work that completes once every op issued so far on this communicator, and every op the
  // caller's current stream was made to wait for, has completed where it runs. Where wait()
  // returns only after completion (Gloo, shared memory) that is so already: a completed Work,
  // nothing sent. Where it only orders a stream (NCCL), a barrier behind them. For a decision
  // taken on the host that must know the ops happened (a commit vote): poll is_completed(), or
  // wait with a timeout. Collective where it is a barrier: every rank calls it.
  WorkPtr fence();

  // Collective over all ranks of this communicator (every rank must call it, with the same
  // `ranks`): returns a communicator over `ranks` (sorted, unique, in range; group rank = position
  // in `ranks`) on members and nullptr on the others.
  std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks);

  // Collective: ranks with equal `color` form one communicator, ordered by (key, rank). A
  // negative color opts out (returns nullptr).
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // Marks the communicator broken and unblocks in-flight ops (they fail with CommError); the same
  // for every sub-group made from it (new_group/split) that is still alive, since they connect the
  // same peers.
  virtual void abort(const std::string& reason) = 0;

  // Optional capabilities are asked for, never found by casting to a backend: each query returns
  // null where there is none (the default); a wrapper answers for what it wraps.
  // The fused narrowed all-reduce (Gloo's shared-memory path); valid as long as this communicator.
  virtual NarrowedAllreduce* narrowed_allreduce() { return nullptr; }
  // A wrapper's communicator underneath (a probe that must not count as the wrapper's traffic
  // runs there); null for a backend.
  virtual Communicator* underlying() { return nullptr; }

 private:
  // The backend's part of each operation above, called with arguments already checked. A wrapper
  // forwards to the public operation of what it wraps.
  virtual WorkPtr do_allreduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual WorkPtr do_broadcast(const at::Tensor& tensor, int root) = 0;
  virtual WorkPtr do_allgather(const at::Tensor& output, const at::Tensor& input) = 0;
  virtual WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  virtual WorkPtr do_send(const at::Tensor& tensor, int dst, uint32_t tag) = 0;
  virtual WorkPtr do_recv(const at::Tensor& tensor, int src, uint32_t tag) = 0;
  virtual WorkPtr do_barrier() = 0;
  // `ranks`: sorted, unique, in range, not empty.
  virtual std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) = 0;

 protected:
  // Defaults a backend may keep or call. send_recv: each op posted by send()/recv(), in order.
  virtual WorkPtr do_send_recv(const std::vector<P2POp>& ops);
  // fence: a completed Work (every op completes at its wait).
  virtual WorkPtr do_fence();

  // What issue() gives an operation: its number on this communicator and its flight-recorder
  // entry, which the backend marks started and ended (FlightRecorder::started/ended).
  struct Issued {
    uint64_t seq = 0;
    uint64_t flight_id = UINT64_MAX;  // none while recording is off
  };
  // Numbers one operation of this backend and records it, enqueued now, in the flight recorder
  // (flight_recorder.h) under this communicator's ranks and backend(). Collectives count apart
  // from send/recv (`p2p`): their numbers must agree across ranks, which send/recv counts need
  // not. A backend calls it from its hook once every check that can fail on this rank alone has
  // passed (a number taken and then abandoned would put this rank out of step with its peers),
  // and in the order its ops are issued; a wrapper never does (the backend it forwards to does).
  // `detail`: what the op moves ("sum, 4.00 MiB float32"). Thread-safe.
  Issued issue(const char* name, const std::string& detail, bool p2p = false);
  // "[0, 1, 3]": the world ranks of this communicator, as messages and the recorder name them.
  const std::string& ranks_text();

 private:
  std::mutex numbering_mutex_;  // guards the members below
  uint64_t next_collective_seq_ = 0;
  uint64_t next_p2p_seq_ = 0;
  std::string ranks_text_;  // made on first use (world_rank() is virtual)
};

}  // namespace tandem
