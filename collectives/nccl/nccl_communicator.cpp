// NCCL communicator. Compiled whenever CUDA + NCCL are found; exercised only on GPU machines
// (tests labelled `gpu`).
#include <tandem/collectives/nccl_communicator.h>

#include <tandem/collectives/flight_recorder.h>

#include "collectives/async_work.h"
#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

namespace tandem {

using detail::AsyncWork;
using detail::check_peer;
using detail::check_reduce_op;
using detail::check_scaled_numel;
using detail::check_tensor;
using detail::dtype_name;
using detail::dump_flight_recorder;
using detail::format_elapsed;
using detail::format_ranks;
using detail::OpDescription;
using detail::record_op;
using detail::tensor_summary;

namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw CommError(std::string("tandem: ") + what + " failed: " + cudaGetErrorString(err));
  }
}

void check_nccl(ncclResult_t res, const std::string& what) {
  if (res != ncclSuccess && res != ncclInProgress) {
    throw CommError("tandem: " + what + " failed: " + ncclGetErrorString(res) +
                    ". A peer rank probably died or the CUDA context is broken.");
  }
}

ncclDataType_t nccl_type(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default:
      throw CommError(std::string("tandem: ") + op + ": NCCL does not support dtype " +
                      dtype_name(t.scalar_type()) + "; cast to int32 or a float type.");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

}  // namespace

class NcclCommunicator;

// Completion = a CUDA event recorded after the op on the communicator's stream.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator> comm, OpDescription d, cudaEvent_t event,
           at::Tensor keep_alive, std::function<void()> on_success);
  ~NcclWork() override { cudaEventDestroy(event_); }
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override { return done_ || cudaEventQuery(event_) != cudaErrorNotReady; }
  std::string describe() const override { return description_.str(); }

 private:
  std::shared_ptr<NcclCommunicator> comm_;
  OpDescription description_;
  cudaEvent_t event_;
  at::Tensor keep_alive_;
  std::function<void()> on_success_;
  AsyncWork::Clock::time_point issued_at_ = AsyncWork::Clock::now();
  uint64_t flight_id_ = record_op(description_);
  bool done_ = false;
};

class NcclCommunicator : public Communicator,
                         public std::enable_shared_from_this<NcclCommunicator> {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, std::vector<int> world_ranks, NcclOptions options)
      : comm_(comm), rank_(rank), world_ranks_(std::move(world_ranks)), options_(options) {
    check_cuda(cudaSetDevice(options_.device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    if (!aborted_) ncclCommDestroy(comm_);
    if (barrier_ptr_ != nullptr) cudaFree(barrier_ptr_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string backend() const override { return "nccl"; }
  int world_rank(int r) const override { return world_ranks_.at(r); }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  WorkPtr allreduce(const at::Tensor& t, ReduceOp op) override {
    check(t, "allreduce", "tensor");
    check_reduce_op(t, op, "allreduce");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    return launch("allreduce", std::string(to_string(op)) + ", " + tensor_summary(t), buf,
                  [&] {
                    return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                                         nccl_type(buf, "allreduce"), nccl_op(op), comm_, stream_);
                  },
                  copy_back_fn(t, buf));
  }

  WorkPtr broadcast(const at::Tensor& t, int root) override {
    check(t, "broadcast", "tensor");
    check_peer(root, size(), "broadcast", "root");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    return launch("broadcast", "root " + std::to_string(root) + ", " + tensor_summary(t), buf,
                  [&] {
                    return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                                         nccl_type(buf, "broadcast"), root, comm_, stream_);
                  },
                  copy_back_fn(t, buf));
  }

  WorkPtr allgather(const at::Tensor& out, const at::Tensor& in) override {
    check(out, "allgather", "output");
    check(in, "allgather", "input");
    check_scaled_numel(out, "output", in, "input", size(), "allgather");
    at::Tensor i = in.contiguous();
    at::Tensor o = out.is_contiguous() ? out : out.contiguous();
    return launch("allgather", tensor_summary(in) + " per rank", o,
                  [&] {
                    return ncclAllGather(i.data_ptr(), o.data_ptr(), i.numel(),
                                         nccl_type(i, "allgather"), comm_, stream_);
                  },
                  copy_back_fn(out, o), i);
  }

  WorkPtr reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    check(out, "reduce_scatter", "output");
    check(in, "reduce_scatter", "input");
    check_scaled_numel(in, "input", out, "output", size(), "reduce_scatter");
    check_reduce_op(in, op, "reduce_scatter");
    at::Tensor i = in.contiguous();
    at::Tensor o = out.is_contiguous() ? out : out.contiguous();
    return launch("reduce_scatter", std::string(to_string(op)) + ", " + tensor_summary(in), o,
                  [&] {
                    return ncclReduceScatter(i.data_ptr(), o.data_ptr(), o.numel(),
                                             nccl_type(i, "reduce_scatter"), nccl_op(op), comm_,
                                             stream_);
                  },
                  copy_back_fn(out, o), i);
  }

  WorkPtr send(const at::Tensor& t, int dst, uint32_t tag) override {
    check_p2p(t, dst, tag, "send");
    at::Tensor buf = t.contiguous();
    return launch("send", tensor_summary(t) + ", to " + std::to_string(dst), buf, [&] {
      return ncclSend(buf.data_ptr(), buf.numel(), nccl_type(buf, "send"), dst, comm_, stream_);
    });
  }

  WorkPtr recv(const at::Tensor& t, int src, uint32_t tag) override {
    check_p2p(t, src, tag, "recv");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    return launch("recv", tensor_summary(t) + ", from " + std::to_string(src), buf,
                  [&] {
                    return ncclRecv(buf.data_ptr(), buf.numel(), nccl_type(buf, "recv"), src,
                                    comm_, stream_);
                  },
                  copy_back_fn(t, buf));
  }

  WorkPtr barrier() override {
    if (barrier_ptr_ == nullptr) check_cuda(cudaMalloc(&barrier_ptr_, sizeof(float)), "cudaMalloc");
    return launch("barrier", "", at::Tensor(), [&] {
      return ncclAllReduce(barrier_ptr_, barrier_ptr_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    for (size_t i = 0; i < ranks.size(); ++i) {
      check_peer(ranks[i], size(), "new_group", "rank");
      if (i > 0 && ranks[i] <= ranks[i - 1]) {
        throw CommError("tandem: new_group: ranks " + format_ranks(ranks) +
                        " must be sorted and unique.");
      }
    }
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
    mark_broken("aborted: " + reason);
    bool expected = false;
    if (aborted_.compare_exchange_strong(expected, true)) ncclCommAbort(comm_);
  }

  void mark_broken(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_reason_.empty()) broken_reason_ = reason;
  }

  ncclComm_t comm() const { return comm_; }

 private:
  void check(const at::Tensor& t, const char* op, const char* arg) {
    check_tensor(t, op, arg, c10::DeviceType::CUDA, "nccl");
    nccl_type(t, op);
  }

  void check_p2p(const at::Tensor& t, int peer, uint32_t tag, const char* op) {
    check(t, op, "tensor");
    check_peer(peer, size(), op, "peer");
    if (tag != 0) {
      throw CommError(std::string("tandem: ") + op +
                      ": NCCL has no message tags; pass tag 0 and post ops in matching order.");
    }
  }

  static std::function<void()> copy_back_fn(const at::Tensor& target, const at::Tensor& buf) {
    if (buf.is_same(target)) return {};
    return [target, buf] { target.copy_(buf); };
  }

  template <class Launch>
  WorkPtr launch(const char* name, std::string detail, const at::Tensor& keep, Launch&& call,
                 std::function<void()> on_success = {}, const at::Tensor& keep2 = {}) {
    OpDescription d;
    d.name = name;
    d.detail = std::move(detail);
    d.ranks = format_ranks(world_ranks_);
    d.backend = "nccl";
    d.p2p = std::strcmp(name, "send") == 0 || std::strcmp(name, "recv") == 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      d.seq = next_seq_++;
      if (!broken_reason_.empty()) {
        throw CommError("tandem: " + d.str() +
                        " refused: the communicator is unusable after an earlier failure: " +
                        broken_reason_);
      }
    }
    std::lock_guard<std::mutex> issue(issue_mutex_);  // issue order = stream order
    check_cuda(cudaSetDevice(options_.device), "cudaSetDevice");
    cudaEvent_t ready, done;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready, static_cast<cudaStream_t>(options_.input_stream)),
               "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    check_nccl(call(), d.str());
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    at::Tensor keep_alive = keep2.defined() ? keep2 : keep;
    return std::make_shared<NcclWork>(shared_from_this(), std::move(d), done, keep_alive,
                                      std::move(on_success));
  }

  std::shared_ptr<Communicator> split_impl(int color, int key, const std::vector<int>& ranks) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config),
               "ncclCommSplit");
    if (color < 0 || child == nullptr) return nullptr;
    int child_rank = 0, child_size = 0;
    check_nccl(ncclCommUserRank(child, &child_rank), "ncclCommUserRank");
    check_nccl(ncclCommCount(child, &child_size), "ncclCommCount");
    // World ranks of the members: exchanged through an allgather on the child.
    std::vector<int> world(child_size, -1);
    if (!ranks.empty()) {
      for (size_t i = 0; i < ranks.size(); ++i) world[i] = world_ranks_[ranks[i]];
    } else {
      int* dev = nullptr;
      check_cuda(cudaMalloc(&dev, sizeof(int) * (child_size + 1)), "cudaMalloc");
      const int mine = world_ranks_[rank_];
      check_cuda(cudaMemcpy(dev + child_size, &mine, sizeof(int), cudaMemcpyHostToDevice),
                 "cudaMemcpy");
      check_nccl(ncclAllGather(dev + child_size, dev, 1, ncclInt32, child, stream_),
                 "ncclAllGather");
      check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      check_cuda(cudaMemcpy(world.data(), dev, sizeof(int) * child_size, cudaMemcpyDeviceToHost),
                 "cudaMemcpy");
      cudaFree(dev);
    }
    return std::make_shared<NcclCommunicator>(child, child_rank, std::move(world), options_);
  }

  ncclComm_t comm_;
  const int rank_;
  const std::vector<int> world_ranks_;
  const NcclOptions options_;
  cudaStream_t stream_ = nullptr;
  std::mutex mutex_;
  std::mutex issue_mutex_;
  uint64_t next_seq_ = 0;
  std::string broken_reason_;
  std::atomic<bool> aborted_{false};
  void* barrier_ptr_ = nullptr;  // one float all-reduced by barrier()
};

NcclWork::NcclWork(std::shared_ptr<NcclCommunicator> comm, OpDescription d, cudaEvent_t event,
                   at::Tensor keep_alive, std::function<void()> on_success)
    : comm_(std::move(comm)),
      description_(std::move(d)),
      event_(event),
      keep_alive_(std::move(keep_alive)),
      on_success_(std::move(on_success)) {}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  if (done_) return;
  if (timeout == kDefaultTimeout) timeout = comm_->timeout();
  const auto deadline = AsyncWork::Clock::now() + timeout;
  for (;;) {
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) check_cuda(state, "cudaEventQuery");
    ncclResult_t async_error = ncclSuccess;
    ncclCommGetAsyncError(comm_->comm(), &async_error);
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
      const std::string msg = "tandem: " + description_.str() + " failed after " +
                              format_elapsed(issued_at_) + ": " +
                              ncclGetErrorString(async_error) +
                              ". A peer rank probably died. The communicator is now unusable." +
                              dump_flight_recorder("failure");
      FlightRecorder::instance().ended(flight_id_, msg);
      comm_->abort(msg);
      throw PeerLostError(msg);
    }
    if (AsyncWork::Clock::now() > deadline) {
      const std::string msg = "tandem: " + description_.str() + " did not complete within " +
                              std::to_string(timeout.count()) + " ms (issued " +
                              format_elapsed(issued_at_) +
                              " ago). A peer rank is hung or dead; the NCCL communicator was "
                              "aborted and is now unusable." + dump_flight_recorder("timeout");
      FlightRecorder::instance().ended(flight_id_, msg);
      comm_->abort(msg);
      throw TimeoutError(msg);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (on_success_) on_success_();
  FlightRecorder::instance().ended(flight_id_);
  done_ = true;
}

}  // namespace tandem

// libtandem_cuda's entry points, found by libtandem.so with dlsym (collectives/cuda_library.cpp).
extern "C" int tandem_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

extern "C" void tandem_cuda_connect_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, const tandem::NcclOptions& options,
                                         std::shared_ptr<tandem::Communicator>& out) {
  using namespace tandem;
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("tandem: connect_nccl: rank " + std::to_string(rank) +
                      " is not in [0, world size " + std::to_string(size) + ").");
  }
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (options.device < 0 || options.device >= devices) {
    throw ConfigError("tandem: connect_nccl: CUDA device " + std::to_string(options.device) +
                      " does not exist (this machine has " + std::to_string(devices) +
                      "); use LOCAL_RANK % device count.");
  }
  check_cuda(cudaSetDevice(options.device), "cudaSetDevice");
  const std::string key = options.store_prefix + "/nccl/unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(bytes, bytes + sizeof id));
  } else {
    try {
      store->wait({key}, options.timeout);
    } catch (const std::exception& e) {
      throw TimeoutError("tandem: rank " + std::to_string(rank) +
                         " did not receive NCCL's unique id from rank 0 within " +
                         std::to_string(options.timeout.count()) + " ms: " + e.what());
    }
    const auto bytes = store->get(key);
    if (bytes.size() != sizeof id) throw CommError("tandem: malformed NCCL unique id in store");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  std::vector<int> world(size);
  for (int i = 0; i < size; ++i) world[i] = i;
  out = std::make_shared<NcclCommunicator>(comm, rank, std::move(world), options);
}
