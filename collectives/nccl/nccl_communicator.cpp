// NCCL communicator (include/tandem/collectives/nccl_communicator.h). Compiled whenever CUDA and
// NCCL are found; exercised only on GPU machines (tests labelled `gpu`). Streams as in c10d's
// ProcessGroupNCCL: an op's NCCL stream waits for the caller's current stream by an event, every
// tensor it touches is recordStream'd on the NCCL stream and kept by the op until its end event,
// Work::wait() makes the caller's stream wait (nccl_op.h), and a watchdog thread finds timeouts
// and NCCL's async errors (nccl_watchdog.h). Connecting and a split's members: nccl_connect.cpp.
#include <tandem/collectives/nccl_communicator.h>

#include <tandem/base/errors.h>
#include <tandem/collectives/flight_recorder.h>

#include "collectives/async_work.h"
#include "collectives/nccl/nccl_comm.h"
#include "collectives/nccl/nccl_op.h"
#include "collectives/nccl/nccl_types.h"
#include "collectives/nccl/nccl_watchdog.h"
#include "collectives/nccl/nccl_work.h"
#include "collectives/sub_groups.h"
#include "collectives/tensor_checks.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <tuple>
#include <utility>

namespace tandem {

using detail::check_cuda;
using detail::check_nccl;
using detail::check_tensor;
using detail::dump_flight_recorder;
using detail::format_elapsed;
using detail::format_ranks;
using detail::nccl_reduce_op;
using detail::nccl_type;
using detail::NcclOp;
using detail::NcclWork;
using detail::OpDescription;
using detail::tensor_summary;

namespace {

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// An enqueue hung inside NCCL (connecting to a dead peer) holds the issue lock; the abort, which
// is what unblocks it, waits this long for the lock and then goes ahead.
constexpr std::chrono::seconds kAbortLockWait{2};

}  // namespace

class NcclCommunicator : public Communicator,
                         public detail::NcclWatchdogOwner,
                         public std::enable_shared_from_this<NcclCommunicator> {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, std::vector<int> world_ranks, NcclOptions options)
      : comm_(comm),
        rank_(rank),
        world_ranks_(std::move(world_ranks)),
        options_(options),
        device_(static_cast<c10::DeviceIndex>(options_.device)),
        // A pool stream, as c10d's: it outlives the communicator, so a tensor recordStream'd on it
        // may be freed after the communicator is gone. From the high-priority pool: checkpoint
        // copies, host staging and codec stages draw from the other one, so a long copy never
        // holds a collective queued behind it on a shared stream.
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {
    c10::cuda::CUDAGuard guard(device_);  // events belong to the device current at creation
    ready_ = std::make_unique<detail::CudaEvent>(events_);
    watchdog_ = std::make_unique<detail::NcclWatchdog>(*this, options_.device, options_.timeout);
  }

  ~NcclCommunicator() override {
    watchdog_->wait_idle();  // each op ends, or times out and the watchdog aborts NCCL
    watchdog_->stop();       // joined: nothing calls NCCL from its thread any more
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    if (!aborted_) ncclCommDestroy(comm_);
    if (barrier_ptr_ != nullptr) cudaFree(barrier_ptr_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string backend() const override { return "nccl"; }
  int world_rank(int r) const override { return world_ranks_.at(r); }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  WorkPtr do_allreduce(const at::Tensor& t, ReduceOp op) override {
    check(t, "allreduce", "tensor");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    return launch("allreduce", std::string(to_string(op)) + ", " + tensor_summary(t), {t, buf},
                  [&] {
                    return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                                         nccl_type(buf, "allreduce"), nccl_reduce_op(op), comm_,
                                         stream_.stream());
                  },
                  copy_back_fn(t, buf));
  }

  WorkPtr do_broadcast(const at::Tensor& t, int root) override {
    check(t, "broadcast", "tensor");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    return launch("broadcast", "root " + std::to_string(root) + ", " + tensor_summary(t), {t, buf},
                  [&] {
                    return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                                         nccl_type(buf, "broadcast"), root, comm_,
                                         stream_.stream());
                  },
                  copy_back_fn(t, buf));
  }

  WorkPtr do_allgather(const at::Tensor& out, const at::Tensor& in) override {
    check(out, "allgather", "output");
    check(in, "allgather", "input");
    at::Tensor i = in.contiguous();
    at::Tensor o = contiguous_output(out);
    return launch("allgather", tensor_summary(in) + " per rank", {out, o, in, i},
                  [&] {
                    return ncclAllGather(i.data_ptr(), o.data_ptr(), i.numel(),
                                         nccl_type(i, "allgather"), comm_, stream_.stream());
                  },
                  copy_back_fn(out, o));
  }

  WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    check(out, "reduce_scatter", "output");
    check(in, "reduce_scatter", "input");
    at::Tensor i = in.contiguous();
    at::Tensor o = contiguous_output(out);
    return launch("reduce_scatter", std::string(to_string(op)) + ", " + tensor_summary(in),
                  {out, o, in, i},
                  [&] {
                    return ncclReduceScatter(i.data_ptr(), o.data_ptr(), o.numel(),
                                             nccl_type(i, "reduce_scatter"), nccl_reduce_op(op), comm_,
                                             stream_.stream());
                  },
                  copy_back_fn(out, o));
  }

  WorkPtr do_send(const at::Tensor& t, int dst, uint32_t tag) override {
    check_p2p(t, tag, "send");
    at::Tensor buf = t.contiguous();
    return launch("send", tensor_summary(t) + ", to " + std::to_string(dst), {t, buf}, [&] {
      return ncclSend(buf.data_ptr(), buf.numel(), nccl_type(buf, "send"), dst, comm_,
                      stream_.stream());
    });
  }

  WorkPtr do_recv(const at::Tensor& t, int src, uint32_t tag) override {
    check_p2p(t, tag, "recv");
    at::Tensor buf = contiguous_output(t);
    return launch("recv", tensor_summary(t) + ", from " + std::to_string(src), {t, buf},
                  [&] {
                    return ncclRecv(buf.data_ptr(), buf.numel(), nccl_type(buf, "recv"), src,
                                    comm_, stream_.stream());
                  },
                  copy_back_fn(t, buf));
  }

  bool p2p_tags(c10::Device) const override { return false; }

  // One NCCL group: its sends and receives progress together, so two peers that each post their
  // send first do not wait on each other.
  WorkPtr do_send_recv(const std::vector<P2POp>& ops) override {
    if (ops.empty()) return Communicator::do_send_recv(ops);
    std::vector<at::Tensor> kept, bufs;
    std::vector<std::function<void()>> copies;  // into non-contiguous receives, after the group
    std::string detail;
    for (const P2POp& op : ops) {
      const bool send = op.kind == P2POp::Kind::kSend;
      check_p2p(op.tensor, op.tag, send ? "send" : "recv");
      bufs.push_back(send ? op.tensor.contiguous() : contiguous_output(op.tensor));
      if (auto copy = send ? nullptr : copy_back_fn(op.tensor, bufs.back())) copies.push_back(copy);
      kept.insert(kept.end(), {op.tensor, bufs.back()});
      detail += (detail.empty() ? "" : "; ") + std::string(send ? "send " : "recv ") +
                tensor_summary(op.tensor) + (send ? ", to " : ", from ") + std::to_string(op.peer);
    }
    std::function<void()> copy_back;
    if (!copies.empty()) copy_back = [copies] { for (const auto& c : copies) c(); };
    return launch("send_recv", detail, std::move(kept), [&] {
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      ncclResult_t result = ncclSuccess;
      for (size_t i = 0; i < ops.size() && result == ncclSuccess; ++i) {
        const at::Tensor& buf = bufs[i];
        result = ops[i].kind == P2POp::Kind::kSend
                     ? ncclSend(buf.data_ptr(), buf.numel(), nccl_type(buf, "send"), ops[i].peer,
                                comm_, stream_.stream())
                     : ncclRecv(buf.data_ptr(), buf.numel(), nccl_type(buf, "recv"), ops[i].peer,
                                comm_, stream_.stream());
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    }, std::move(copy_back));
  }

  WorkPtr do_barrier() override {
    {
      c10::cuda::CUDAGuard guard(device_);
      std::lock_guard<std::mutex> lock(mutex_);
      if (barrier_ptr_ == nullptr) {
        check_cuda(cudaMalloc(&barrier_ptr_, sizeof(float)), "cudaMalloc");
      }
    }
    return launch("barrier", "", {}, [&] {
      return ncclAllReduce(barrier_ptr_, barrier_ptr_, 1, ncclFloat32, ncclSum, comm_,
                           stream_.stream());
    });
  }

  // wait() only orders a stream here: a barrier behind every op is what completes after them.
  WorkPtr do_fence() override { return barrier(); }

  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override {
    int position = -1;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == rank_) position = static_cast<int>(i);
    }
    return split_impl(position >= 0 ? 0 : -1, position, ranks);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    return split_impl(color, key, {});
  }

  void abort(const std::string& reason) override {
    FlightRecorder::instance().dump("abort");
    fail(nullptr, nullptr, "aborted: " + reason, false);
    groups_.abort(reason);
  }

  // ---- detail::NcclWatchdogOwner (the watchdog thread; op_timed_out also a waiting thread) ----

  void op_timed_out(const std::shared_ptr<NcclOp>& op, std::chrono::milliseconds timeout) override {
    if (op->poll() != NcclOp::Status::kPending) return;  // it ended meanwhile
    const std::string msg =
        "tandem: " + op->description().str() + " did not complete within " + seconds(timeout) +
        " on rank " + std::to_string(world_ranks_[rank_]) + " (nccl, cuda:" +
        std::to_string(options_.device) + "; issued " + format_elapsed(op->issued_at()) +
        " ago). A peer rank is hung or dead, or the ranks issued collectives in different "
        "orders. The NCCL communicator was aborted and is now unusable; restart the group. If "
        "the op is only slow, raise the timeout: --set comm.timeout_s=<seconds> "
        "(NcclOptions::timeout with connect_nccl)." +
        dump_flight_recorder("timeout");
    fail(op, std::make_exception_ptr(TimeoutError(msg)), msg, false);
  }

  void op_failed(const std::shared_ptr<NcclOp>& op) override {
    if (broken()) return;  // failed by the communicator's own failure
    std::string what = "a CUDA error";
    try {
      if (auto error = op->error()) std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    }
    fail(nullptr, nullptr, what, false);
  }

  ncclResult_t async_error_state() override {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    ncclResult_t state = ncclSuccess;
    if (aborted_ || ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclSuccess;
    return state;
  }

  void async_error(ncclResult_t error, const std::shared_ptr<NcclOp>& oldest) override {
    const std::string what =
        oldest ? oldest->description().str() + " failed after " + format_elapsed(oldest->issued_at())
               : "the NCCL communicator on ranks " + format_ranks(world_ranks_) + " failed";
    const std::string msg = "tandem: " + what + " on rank " + std::to_string(world_ranks_[rank_]) +
                            ": NCCL reports " + ncclGetErrorString(error) +
                            " (ncclCommGetAsyncError). A peer rank probably died; see its log. "
                            "The communicator is now unusable." +
                            dump_flight_recorder("failure");
    fail(oldest, std::make_exception_ptr(PeerLostError(msg)), msg, true);
  }

 private:
  void check(const at::Tensor& t, const char* op, const char* arg) {
    check_tensor(t, op, arg, c10::DeviceType::CUDA, "nccl");
    nccl_type(t, op);
    if (t.device().index() != options_.device) {
      throw CommError(std::string("tandem: ") + op + ": argument '" + arg + "' is on " +
                      t.device().str() + " but this NCCL communicator runs on cuda:" +
                      std::to_string(options_.device) +
                      " (NcclOptions::device; tandem::init uses LOCAL_RANK % device count); "
                      "move the tensor to that device.");
    }
  }

  // The peer is in range already (Communicator::send/recv).
  void check_p2p(const at::Tensor& t, uint32_t tag, const char* op) {
    check(t, op, "tensor");
    if (tag != 0) {
      throw CommError(std::string("tandem: ") + op + ": tag " + std::to_string(tag) +
                      ", but NCCL has no message tags; pass tag 0 and post ops in matching order.");
    }
  }

  // The caller's tensor when it is contiguous, else a buffer the op writes and copies back.
  static at::Tensor contiguous_output(const at::Tensor& t) {
    return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
  }

  // Runs on the NCCL stream after the op (launch() makes it current), before the end event.
  static std::function<void()> copy_back_fn(const at::Tensor& target, const at::Tensor& buf) {
    if (buf.is_same(target)) return {};
    return [target, buf] {
      at::NoGradGuard no_grad;  // a communication buffer, not part of the graph
      target.copy_(buf);
    };
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !broken_reason_.empty();
  }

  void mark_broken(const std::string& reason, bool lost) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_reason_.empty()) return;
    broken_reason_ = reason;
    broken_by_lost_peer_ = lost;
  }

  void throw_if_broken(const std::string& what) {  // under mutex_
    if (broken_reason_.empty()) return;
    const std::string msg = "tandem: " + what +
                            " refused: the communicator is unusable after an earlier failure: " +
                            broken_reason_;
    if (broken_by_lost_peer_) throw PeerLostError(msg);
    throw CommError(msg);
  }

  // Every failure ends here. The first reason breaks the communicator; `first` (if any) fails with
  // `error`, every other pending op with an error naming the reason; then NCCL is aborted, which
  // makes kernels waiting for a peer return. Never throws.
  void fail(const std::shared_ptr<NcclOp>& first, std::exception_ptr error,
            const std::string& reason, bool lost) {
    mark_broken(reason, lost);  // no op is issued after this
    if (first) first->fail(error);
    // An op being issued now is in the list once its launch() lets go of the issue lock.
    std::unique_lock<std::timed_mutex> issue(issue_mutex_, std::defer_lock);
    (void)issue.try_lock_for(kAbortLockWait);
    for (const auto& op : watchdog_->ops()) {
      if (op == first || !op->pending()) continue;
      const std::string msg = "tandem: " + op->description().str() +
                              " did not complete: the NCCL communicator was aborted: " + reason;
      op->fail(lost ? std::make_exception_ptr(PeerLostError(msg))
                    : std::make_exception_ptr(CommError(msg)));
    }
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  // Issues one op: the NCCL stream waits for the caller's current stream, `call` enqueues the
  // NCCL op, `copy_back` (if any) runs on the NCCL stream, then the end event. `tensors` are
  // recordStream'd on the NCCL stream and kept by the op until its end event.
  template <class Call>
  WorkPtr launch(const char* name, std::string detail, std::vector<at::Tensor> tensors, Call&& call,
                 std::function<void()> copy_back = {}) {
    OpDescription d;
    d.name = name;
    d.detail = std::move(detail);
    d.ranks = ranks_text();
    d.p2p = std::strcmp(name, "send") == 0 || std::strcmp(name, "recv") == 0 ||
            std::strcmp(name, "send_recv") == 0;
    std::lock_guard<std::timed_mutex> issuing(issue_mutex_);  // issue order = number = stream order
    const Issued issued = issue(name, d.detail, d.p2p);
    d.seq = issued.seq;
    d.flight_id = issued.flight_id;
    c10::cuda::CUDAGuard guard(device_);
    std::shared_ptr<NcclOp> op;
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        throw_if_broken(d.str());
      }
      // The producer: whatever the caller queued so far on its current stream, the contiguous
      // copies made above included.
      const cudaStream_t producer = c10::cuda::getCurrentCUDAStream(device_).stream();
      check_cuda(cudaEventRecord(ready_->get(), producer), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(stream_.stream(), ready_->get(), 0), "cudaStreamWaitEvent");
      op = std::make_shared<NcclOp>(std::move(d), options_.device, events_);
    } catch (const std::exception& e) {
      FlightRecorder::instance().ended(issued.flight_id, e.what());  // it never reached NCCL
      throw;
    }
    try {
      check_cuda(cudaEventRecord(op->start_event(), stream_.stream()), "cudaEventRecord");
      check_nccl(call(), op->description().str());
      if (copy_back) {
        c10::cuda::CUDAStreamGuard on_nccl_stream(stream_);
        copy_back();
      }
      check_cuda(cudaEventRecord(op->end_event(), stream_.stream()), "cudaEventRecord");
      for (const auto& t : tensors) {
        if (t.defined() && t.storage().data() != nullptr) {
          c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
        }
      }
    } catch (...) {
      op->fail(std::current_exception());  // ends its flight-recorder entry
      throw;
    }
    op->keep(std::move(tensors));
    watchdog_->add(op);
    return std::make_shared<NcclWork>(std::move(op), shared_from_this());
  }

  std::shared_ptr<Communicator> split_impl(int color, int key, const std::vector<int>& ranks) {
    // The members' world ranks and this rank's place among them, before ncclCommSplit takes the
    // issue lock (the gather is an op of this communicator).
    std::vector<int> world;
    int position = -1;
    if (!ranks.empty()) {
      for (size_t i = 0; i < ranks.size(); ++i) {
        world.push_back(world_ranks_[ranks[i]]);
        if (ranks[i] == rank_) position = static_cast<int>(i);
      }
    } else {
      std::tie(world, position) = detail::split_members(*this, device_, color, key, world_ranks_);
    }
    std::lock_guard<std::timed_mutex> issue(issue_mutex_);  // ncclCommSplit is a collective
    {
      std::lock_guard<std::mutex> lock(mutex_);
      throw_if_broken(ranks.empty() ? "split" : "new_group " + format_ranks(ranks));
    }
    c10::cuda::CUDAGuard guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config),
               "ncclCommSplit");
    if (color < 0 || child == nullptr) return nullptr;
    int child_rank = 0, child_size = 0;
    check_nccl(ncclCommUserRank(child, &child_rank), "ncclCommUserRank");
    check_nccl(ncclCommCount(child, &child_size), "ncclCommCount");
    if (child_rank != position || child_size != static_cast<int>(world.size())) {
      ncclCommDestroy(child);
      throw CommError("tandem: " + std::string(ranks.empty() ? "split" : "new_group") +
                      ": NCCL made this rank " + std::to_string(child_rank) + " of " +
                      std::to_string(child_size) + ", the gathered membership says " +
                      std::to_string(position) + " of " + std::to_string(world.size()) +
                      " (ranks " + format_ranks(world) + "). This is a bug in tandem; please report it.");
    }
    return groups_.add(std::make_shared<NcclCommunicator>(child, child_rank, std::move(world), options_));
  }

  const ncclComm_t comm_;
  const int rank_;
  const std::vector<int> world_ranks_;
  const NcclOptions options_;
  const c10::DeviceIndex device_;
  const c10::cuda::CUDAStream stream_;  // the NCCL stream
  const std::shared_ptr<detail::CudaEventPool> events_ = std::make_shared<detail::CudaEventPool>();
  std::unique_ptr<detail::CudaEvent> ready_;  // the producer's point, re-recorded per op
  std::mutex mutex_;                          // broken state, barrier buffer
  std::timed_mutex issue_mutex_;              // one thread issues to NCCL at a time
  detail::SubGroups groups_;                  // aborted with this one
  std::mutex nccl_mutex_;                     // aborted_ and NCCL calls from the watchdog
  std::string broken_reason_;
  bool broken_by_lost_peer_ = false;
  bool aborted_ = false;
  void* barrier_ptr_ = nullptr;  // one float all-reduced by barrier()
  std::unique_ptr<detail::NcclWatchdog> watchdog_;  // stopped first in the destructor
};

}  // namespace tandem

namespace tandem::detail {

std::shared_ptr<Communicator> make_nccl_communicator(ncclComm_t comm, int rank,
                                                     std::vector<int> world_ranks,
                                                     const NcclOptions& options) {
  return std::make_shared<NcclCommunicator>(comm, rank, std::move(world_ranks), options);
}

}  // namespace tandem::detail
