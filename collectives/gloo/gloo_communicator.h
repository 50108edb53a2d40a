// Internal: the Gloo implementation behind connect_gloo(), in three files: connection, op queue
// and groups (gloo_communicator.cpp), collectives (gloo_collectives.cpp), point-to-point
// (gloo_p2p.cpp). Gloo itself is reached through the GlooMesh seam (gloo_mesh.h): its headers
// and symbols stay inside libtandem_gloo.so.
#pragma once

#include "base/serial_executor.h"
#include "collectives/async_work.h"
#include "collectives/gloo/gloo_mesh.h"
#include "collectives/sub_groups.h"

#include <tandem/collectives/gloo_communicator.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

namespace tandem::detail {

class HostStaging;
class ShmCollectives;

// True when `e` says an op ran out of time: a TimeoutError, or Gloo's timed-out I/O error
// (gloo_mesh.h). Never decided by the message's words.
bool is_timeout(const std::exception& e);
// True when `e` says a peer is gone: a PeerLostError, or Gloo's I/O error (gloo_mesh.h).
bool peer_lost(const std::exception& e);
// The error an op that failed with `cause` ends with, as a TimeoutError, PeerLostError or
// CommError carrying `message`.
std::exception_ptr op_error(const std::exception& cause, bool timed_out, const std::string& message);
// Contiguous tensor with the caller's data (itself when already contiguous).
at::Tensor contiguous_view(const at::Tensor& t);
// Copies `buffer` into `target` unless they are the same tensor.
void copy_back(const at::Tensor& target, const at::Tensor& buffer);

// A posted send/recv: kept alive by the communicator until waited, because Gloo's transport
// writes into the buffer until the op completes.
struct GlooP2PState {
  at::Tensor target;   // the caller's tensor
  at::Tensor staging;  // contiguous buffer the transport reads/writes (may be `target`)
  std::shared_ptr<HostStaging> host;  // a CUDA `target`'s staging; `staging` is its host buffer
  std::unique_ptr<GlooBuffer> buffer;
  bool is_send = false;
  std::atomic<bool> waited{false};
  std::exception_ptr error;
};

class GlooCommunicator final : public Communicator,
                               public NarrowedAllreduce,
                               public std::enable_shared_from_this<GlooCommunicator> {
 public:
  // Connects through `store` under `prefix`; `world_ranks[i]` is group rank i's world rank.
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<GlooDevice> device,
                   std::string prefix, int rank, std::vector<int> world_ranks, GlooOptions options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string backend() const override { return "gloo"; }
  int world_rank(int group_rank) const override { return world_ranks_.at(group_rank); }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  std::shared_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& reason) override;

  // Sum of float32 `tensor` with the values travelling as `wire` (kHalf, kBFloat16), each rank
  // sending (tensor / divisor) rounded: ShmCollectives::allreduce_narrowed. Null where the op would
  // not go through shared memory, or `tensor` is not contiguous float32: the caller casts itself
  // (the same op on the wire, so ranks may differ in which they take).
  WorkPtr allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire, int divisor) override;
  NarrowedAllreduce* narrowed_allreduce() override { return this; }

  // Marks the communicator broken with `reason` (first reason wins); `peer_lost`: because a peer
  // is gone (later ops are refused with PeerLostError then, else CommError).
  void mark_broken(const std::string& reason, bool peer_lost = false);

 private:
  WorkPtr do_allreduce(const at::Tensor& tensor, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override;
  WorkPtr do_allgather(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  WorkPtr do_send(const at::Tensor& tensor, int dst, uint32_t tag) override;
  WorkPtr do_recv(const at::Tensor& tensor, int src, uint32_t tag) override;
  WorkPtr do_barrier() override;
  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override;

  // abort() without the sub-groups (the destructor: they may outlive this one).
  void abort_self(const std::string& reason);
  // Numbers and records the op (Communicator::issue): call it after the checks that can fail here.
  OpDescription describe(const char* name, std::string detail, bool p2p = false);
  // Queues `run` on the op thread; throws CommError at once if the communicator is broken.
  WorkPtr enqueue(OpDescription description, std::function<void()> run);
  // enqueue() for an op whose CUDA tensors `staging` holds (null: CPU tensors only): `run` works
  // on their host buffers after the copies in, the copies back follow it, and the Work's wait()
  // makes the caller's current stream wait for them.
  WorkPtr enqueue_staged(OpDescription description, std::shared_ptr<HostStaging> staging,
                         std::function<void()> run);
  // Runs one queued op on the op thread and completes its Work.
  void run_op(AsyncWork& work, const std::function<void()>& run);
  WorkPtr post_p2p(const at::Tensor& tensor, int peer, uint32_t tag, bool is_send);
  // Refuses an op of a broken communicator (its flight-recorder entry ends failed).
  void throw_if_broken(const OpDescription& description);
  // After `d` timed out here: which members never joined it, as a sentence (store exchange).
  std::string who_never_joined(const OpDescription& d);
  static constexpr std::chrono::milliseconds kJoinGrace{2000};
  std::shared_ptr<GlooCommunicator> make_group(const std::vector<int>& ranks,
                                               const std::string& name);
  // Ring reduce-scatter over `buffer` (size() equal chunks, reduced in place) into `out`.
  void ring_reduce_scatter(at::Tensor& buffer, at::Tensor& out, ReduceOp op, uint32_t tag);

  const c10::intrusive_ptr<c10d::Store> store_;
  const std::shared_ptr<GlooDevice> device_;
  const std::string prefix_;
  const int rank_;
  const std::vector<int> world_ranks_;
  const GlooOptions options_;
  std::unique_ptr<GlooMesh> mesh_;
  // Allreduce, reduce-scatter and all-gather through shared memory when every rank is on this
  // host (null: Gloo).
  std::unique_ptr<ShmCollectives> shm_;
  detail::SubGroups groups_;  // aborted with this one

  std::mutex mutex_;  // guards the members up to ops_
  std::string broken_reason_;
  bool broken_by_lost_peer_ = false;
  uint64_t next_group_ = 0;
  std::vector<std::shared_ptr<GlooP2PState>> p2p_in_flight_;
  // The op thread ("tandem-gloo"): collectives run there one after another, in issue order.
  // Last: drained by the destructor while everything above still lives.
  SerialExecutor ops_{"tandem-gloo"};
};

}  // namespace tandem::detail
