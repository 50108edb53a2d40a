#include "collectives/gloo_communicator.h"

#include "collectives/gloo_store_adapter.h"
#include "collectives/reduce_kernels.h"
#include "collectives/shm_allreduce.h"
#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <ATen/ops/empty.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>

namespace tandem {

namespace {

// Slot prefixes for tandem's own transfers; Gloo's collectives use 0x01..0x08.
constexpr uint8_t kP2PSlotPrefix = 0x20;
constexpr uint8_t kReduceScatterSlotPrefix = 0x21;

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

bool looks_like_timeout(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
}

// Gloo's typed setters only use sizeof(T): pick an unsigned type of the element's width.
template <class Setter>
void with_element_type(size_t element_size, Setter&& set) {
  switch (element_size) {
    case 1: set(static_cast<uint8_t*>(nullptr)); break;
    case 2: set(static_cast<uint16_t*>(nullptr)); break;
    case 4: set(static_cast<uint32_t*>(nullptr)); break;
    case 8: set(static_cast<uint64_t*>(nullptr)); break;
    default: throw CommError("tandem: unsupported element size " + std::to_string(element_size));
  }
}

template <class T>
T* typed(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Contiguous tensor with the caller's data (itself when already contiguous).
at::Tensor contiguous_view(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void copy_back(const at::Tensor& target, const at::Tensor& buffer) {
  if (!buffer.is_same(target)) target.copy_(buffer.view(target.sizes()));
}

}  // namespace

// A posted send/recv: kept alive by the communicator until waited, because Gloo's transport
// writes into the buffer until the op completes.
struct GlooP2PState {
  at::Tensor target;   // the caller's tensor
  at::Tensor staging;  // contiguous buffer the transport reads/writes (may be `target`)
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  bool is_send = false;
  std::atomic<bool> waited{false};
  std::exception_ptr error;
};

namespace {

class GlooP2PWork : public Work {
 public:
  GlooP2PWork(std::shared_ptr<GlooP2PState> state, OpDescription description,
              std::weak_ptr<GlooCommunicator> comm, std::chrono::milliseconds default_timeout)
      : state_(std::move(state)),
        description_(std::move(description)),
        comm_(std::move(comm)),
        default_timeout_(default_timeout) {}

  void wait(std::chrono::milliseconds timeout) override {
    if (state_->waited) {
      if (state_->error) std::rethrow_exception(state_->error);
      return;
    }
    if (timeout == kDefaultTimeout) timeout = default_timeout_;
    try {
      if (state_->buffer) {
        const bool ok = state_->is_send ? state_->buffer->waitSend(timeout)
                                        : state_->buffer->waitRecv(timeout);
        if (!ok) throw CommError("the communicator was aborted");
      }
      if (!state_->is_send) copy_back(state_->target, state_->staging);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = looks_like_timeout(what);
      const std::string msg =
          "tandem: " + description_.str() + (timed_out ? " timed out" : " failed") + " after " +
          format_elapsed(issued_at_) + ": " + what +
          (timed_out ? ". The peer is hung or never posted the matching op (same tag, same size)."
                     : ". The peer probably died; see its log.") +
          " The communicator is now unusable.";
      state_->error = timed_out ? std::make_exception_ptr(TimeoutError(msg))
                                : std::make_exception_ptr(CommError(msg));
      state_->waited = true;
      if (auto comm = comm_.lock()) comm->mark_broken(msg);
      std::rethrow_exception(state_->error);
    }
    state_->waited = true;
  }

  bool is_completed() override { return state_->waited; }
  std::string describe() const override { return description_.str(); }

 private:
  std::shared_ptr<GlooP2PState> state_;
  OpDescription description_;
  std::weak_ptr<GlooCommunicator> comm_;
  std::chrono::milliseconds default_timeout_;
  AsyncWork::Clock::time_point issued_at_ = AsyncWork::Clock::now();
};

}  // namespace

std::shared_ptr<Communicator> connect_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("tandem: connect_gloo: rank " + std::to_string(rank) +
                      " is not in [0, world size " + std::to_string(size) +
                      "); check RANK and WORLD_SIZE.");
  }
  if (!store) throw ConfigError("tandem: connect_gloo: store is null");
  gloo::transport::tcp::attr attr;
  if (!options.interface.empty()) {
    attr.iface = options.interface;
  } else {
    attr.hostname = options.hostname;
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError("tandem: cannot open a TCP device on " +
                    (options.interface.empty() ? "host '" + options.hostname + "'"
                                               : "interface '" + options.interface + "'") +
                    ": " + e.what() + ". Set GlooOptions::hostname/interface to an address of this "
                    "machine that the other ranks can reach.");
  }
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  return std::make_shared<GlooCommunicator>(store, std::move(device),
                                            options.store_prefix + "/world", rank,
                                            std::move(ranks), options);
}

GlooCommunicator::GlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::string prefix, int rank, std::vector<int> world_ranks,
                                   GlooOptions options)
    : store_(std::move(store)),
      device_(std::move(device)),
      prefix_(std::move(prefix)),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      options_(std::move(options)) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size());
  context->setTimeout(options_.timeout);
  GlooStoreAdapter adapter(c10::make_intrusive<c10d::PrefixStore>(prefix_, store_),
                           "rendezvous of " + std::to_string(size()) + " ranks under '" +
                               prefix_ + "' (this is world rank " +
                               std::to_string(world_ranks_[rank_]) + ")",
                           size());
  try {
    context->connectFullMesh(adapter, device_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("tandem: connecting " + std::to_string(size()) + " ranks under '" + prefix_ +
                    "' failed: " + e.what() +
                    ". Check that the ranks can reach each other (GlooOptions::hostname).");
  }
  context_ = std::move(context);
  // Collective like the rendezvous above: every rank reaches the same answer.
  shm_ = connect_shm_allreduce(store_, prefix_, rank_, world_ranks_, options_);
  op_thread_ = std::thread([this] { run_ops(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (op_thread_.joinable()) op_thread_.join();
  // Unwaited sends/recvs may still be referenced by the transport: close connections first.
  const bool pending = std::any_of(p2p_in_flight_.begin(), p2p_in_flight_.end(),
                                   [](const auto& s) { return !s->waited; });
  if (pending) abort("communicator destroyed with send/recv ops that were never waited");
  p2p_in_flight_.clear();
}

void GlooCommunicator::mark_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_reason_.empty()) broken_reason_ = reason;
}

void GlooCommunicator::abort(const std::string& reason) {
  mark_broken("aborted: " + reason);
  if (shm_) shm_->abort();
  for (int i = 0; i < size(); ++i) {
    if (i == rank_) continue;
    try {
      auto& pair = context_->getPair(i);
      if (pair) pair->close();
    } catch (const std::exception&) {
      // Closing is best effort: a pair that failed already is closed.
    }
  }
}

OpDescription GlooCommunicator::describe(const char* name, std::string detail, bool p2p) {
  OpDescription d;
  d.name = name;
  d.detail = std::move(detail);
  d.ranks = format_ranks(world_ranks_);
  std::lock_guard<std::mutex> lock(mutex_);
  // Collectives number themselves apart from point-to-point ops: their number is Gloo's tag and
  // must agree across ranks, which send/recv counts need not.
  d.seq = p2p ? next_p2p_seq_++ : next_collective_seq_++;
  return d;
}

void GlooCommunicator::throw_if_broken(const OpDescription& description) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_reason_.empty()) {
    throw CommError("tandem: " + description.str() +
                    " refused: the communicator is unusable after an earlier failure: " +
                    broken_reason_);
  }
}

WorkPtr GlooCommunicator::enqueue(OpDescription description, std::function<void()> run) {
  throw_if_broken(description);
  std::weak_ptr<GlooCommunicator> weak = weak_from_this();
  auto work = std::make_shared<AsyncWork>(std::move(description), options_.timeout,
                                          [weak](const std::string& msg) {
                                            if (auto self = weak.lock()) self->mark_broken(msg);
                                          });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Task{work, std::move(run)});
  }
  queue_cv_.notify_one();
  return work;
}

void GlooCommunicator::run_ops() {
  pthread_setname_np(pthread_self(), "tandem-gloo");
  for (;;) {
    Task task;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_reason_;
    }
    const OpDescription& d = task.work->description();
    std::exception_ptr error;
    if (!broken.empty()) {
      error = std::make_exception_ptr(CommError(
          "tandem: " + d.str() + " was not run: the communicator became unusable: " + broken));
    } else {
      try {
        trace::Span span(d.name.c_str(), trace::kComm);  // the op on the wire, on this thread
        if (trace::enabled()) span.arg("op", d.str());
        task.run();
      } catch (const std::exception& e) {
        const std::string what = e.what();
        const bool timed_out = looks_like_timeout(what);
        const std::string msg =
            "tandem: " + d.str() + (timed_out ? " timed out" : " failed") + " after " +
            format_elapsed(task.work->issued_at()) + ": " + what +
            (timed_out ? ". A peer rank is hung or did not issue this op (ranks must issue "
                         "collectives in the same order)."
                       : ". A peer rank probably died; see its log.") +
            " The communicator is now unusable.";
        mark_broken(msg);
        error = timed_out ? std::make_exception_ptr(TimeoutError(msg))
                          : std::make_exception_ptr(CommError(msg));
      }
    }
    task.work->finish(error);
  }
}

WorkPtr GlooCommunicator::allreduce(const at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce", "tensor", c10::DeviceType::CPU, "gloo");
  check_reduce_op(tensor, op, "allreduce");
  auto d = describe("allreduce", std::string(to_string(op)) + ", " + tensor_summary(tensor));
  const ReduceFn fn = reduce_kernel(tensor.scalar_type(), op);
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  const uint64_t seq = d.seq;
  return enqueue(std::move(d), [this, tensor, op, fn, tag, seq] {
    if (tensor.numel() == 0) return;
    at::Tensor buf = contiguous_view(tensor);
    const size_t nbytes = buf.numel() * buf.element_size();
    if (shm_) {
      shm_->allreduce(buf, op, seq);  // divides for avg itself
      copy_back(tensor, buf);
      return;
    }
    if (size() > 1) {
      gloo::AllreduceOptions opts(context_);
      with_element_type(buf.element_size(), [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        opts.setOutput<T>(typed<T>(buf), buf.numel());
      });
      opts.setReduceFunction(fn);
      opts.setTag(tag);
      opts.setTimeout(options_.timeout);
      const bool small = nbytes < options_.ring_threshold_bytes && is_power_of_two(size());
      opts.setAlgorithm(small ? gloo::AllreduceOptions::Algorithm::BCUBE
                              : gloo::AllreduceOptions::Algorithm::RING);
      gloo::allreduce(opts);
    }
    if (op == ReduceOp::kAvg) buf.div_(size());
    copy_back(tensor, buf);
  });
}

WorkPtr GlooCommunicator::broadcast(const at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "tensor", c10::DeviceType::CPU, "gloo");
  check_peer(root, size(), "broadcast", "root");
  auto d = describe("broadcast", "root " + std::to_string(root) + ", " + tensor_summary(tensor));
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  return enqueue(std::move(d), [this, tensor, root, tag] {
    if (tensor.numel() == 0 || size() == 1) return;
    at::Tensor buf = contiguous_view(tensor);
    gloo::BroadcastOptions opts(context_);
    with_element_type(buf.element_size(), [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      opts.setOutput<T>(typed<T>(buf), buf.numel());
    });
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
    if (rank_ != root) copy_back(tensor, buf);
  });
}

WorkPtr GlooCommunicator::allgather(const at::Tensor& output, const at::Tensor& input) {
  check_tensor(output, "allgather", "output", c10::DeviceType::CPU, "gloo");
  check_tensor(input, "allgather", "input", c10::DeviceType::CPU, "gloo");
  check_scaled_numel(output, "output", input, "input", size(), "allgather");
  auto d = describe("allgather", tensor_summary(input) + " per rank");
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  return enqueue(std::move(d), [this, output, input, tag] {
    if (input.numel() == 0) return;
    at::Tensor in = contiguous_view(input);
    at::Tensor out = contiguous_view(output);
    if (size() == 1) {
      out.view(in.sizes()).copy_(in);
    } else {
      gloo::AllgatherOptions opts(context_);
      with_element_type(in.element_size(), [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        opts.setInput<T>(typed<T>(in), in.numel());
        opts.setOutput<T>(typed<T>(out), out.numel());
      });
      opts.setTag(tag);
      opts.setTimeout(options_.timeout);
      gloo::allgather(opts);
    }
    copy_back(output, out);
  });
}

WorkPtr GlooCommunicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                         ReduceOp op) {
  check_tensor(output, "reduce_scatter", "output", c10::DeviceType::CPU, "gloo");
  check_tensor(input, "reduce_scatter", "input", c10::DeviceType::CPU, "gloo");
  check_scaled_numel(input, "input", output, "output", size(), "reduce_scatter");
  check_reduce_op(input, op, "reduce_scatter");
  auto d = describe("reduce_scatter", std::string(to_string(op)) + ", " + tensor_summary(input));
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  return enqueue(std::move(d), [this, output, input, op, tag] {
    if (output.numel() == 0) return;
    // The ring reduces in place, so it works on a private copy of the input.
    at::Tensor buf = input.reshape({-1}).clone();
    at::Tensor out = contiguous_view(output);
    ring_reduce_scatter(buf, out, op, tag);
    if (op == ReduceOp::kAvg) out.div_(size());
    copy_back(output, out);
  });
}

void GlooCommunicator::ring_reduce_scatter(at::Tensor& buffer, at::Tensor& out, ReduceOp op,
                                           uint32_t tag) {
  const int p = size();
  const int64_t n = out.numel();
  const size_t chunk_bytes = static_cast<size_t>(n) * buffer.element_size();
  char* base = static_cast<char*>(buffer.data_ptr());
  if (p > 1) {
    const ReduceFn fn = reduce_kernel(buffer.scalar_type(), op);
    at::Tensor incoming = buffer.new_empty({n});
    auto send_buf = context_->createUnboundBuffer(base, chunk_bytes * p);
    auto recv_buf = context_->createUnboundBuffer(incoming.data_ptr(), chunk_bytes);
    const int right = (rank_ + 1) % p;
    const int left = (rank_ + p - 1) % p;
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    auto chunk = [p](int c) { return ((c % p) + p) % p; };
    // Step s: pass chunk (r-s-1) right, fold chunk (r-s-2) from the left into ours. After p-1
    // steps chunk r holds the full reduction.
    for (int s = 0; s < p - 1; ++s) {
      const int send_chunk = chunk(rank_ - s - 1);
      const int recv_chunk = chunk(rank_ - s - 2);
      send_buf->send(right, slot, send_chunk * chunk_bytes, chunk_bytes);
      recv_buf->recv(left, slot, 0, chunk_bytes);
      if (!recv_buf->waitRecv(options_.timeout)) throw CommError("receive aborted");
      char* dst = base + recv_chunk * chunk_bytes;
      fn(dst, dst, incoming.data_ptr(), static_cast<size_t>(n));
      if (!send_buf->waitSend(options_.timeout)) throw CommError("send aborted");
    }
  }
  out.copy_(buffer.narrow(0, rank_ * n, n).view(out.sizes()));
}

WorkPtr GlooCommunicator::barrier() {
  auto d = describe("barrier", "");
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  return enqueue(std::move(d), [this, tag] {
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

WorkPtr GlooCommunicator::send(const at::Tensor& tensor, int dst, uint32_t tag) {
  return post_p2p(tensor, dst, tag, /*is_send=*/true);
}

WorkPtr GlooCommunicator::recv(const at::Tensor& tensor, int src, uint32_t tag) {
  return post_p2p(tensor, src, tag, /*is_send=*/false);
}

WorkPtr GlooCommunicator::post_p2p(const at::Tensor& tensor, int peer, uint32_t tag,
                                   bool is_send) {
  const char* op = is_send ? "send" : "recv";
  check_tensor(tensor, op, "tensor", c10::DeviceType::CPU, "gloo");
  check_peer(peer, size(), op, is_send ? "dst" : "src");
  if (peer == rank_) {
    throw CommError(std::string("tandem: ") + op + " to/from this rank (" +
                    std::to_string(rank_) + ") is not supported; copy the tensor locally.");
  }
  auto d = describe(op,
                    tensor_summary(tensor) + (is_send ? ", to " : ", from ") +
                        std::to_string(peer) + ", tag " + std::to_string(tag),
                    /*p2p=*/true);
  throw_if_broken(d);
  auto state = std::make_shared<GlooP2PState>();
  state->is_send = is_send;
  state->target = tensor;
  state->staging = is_send ? contiguous_view(tensor)
                           : (tensor.is_contiguous() ? tensor : tensor.new_empty(tensor.sizes()));
  const size_t nbytes = state->staging.numel() * state->staging.element_size();
  {
    // Posting under the lock makes the posting order the issue order.
    std::lock_guard<std::mutex> lock(mutex_);
    if (nbytes > 0) {
      state->buffer = context_->createUnboundBuffer(state->staging.data_ptr(), nbytes);
      const uint64_t slot = gloo::Slot::build(kP2PSlotPrefix, tag);
      if (is_send) {
        state->buffer->send(peer, slot);
      } else {
        state->buffer->recv(peer, slot);
      }
    }
    p2p_in_flight_.erase(std::remove_if(p2p_in_flight_.begin(), p2p_in_flight_.end(),
                                        [](const auto& s) { return s->waited.load(); }),
                         p2p_in_flight_.end());
    p2p_in_flight_.push_back(state);
  }
  return std::make_shared<GlooP2PWork>(std::move(state), std::move(d), weak_from_this(),
                                       options_.timeout);
}

std::shared_ptr<GlooCommunicator> GlooCommunicator::make_group(const std::vector<int>& ranks,
                                                               const std::string& name) {
  std::vector<int> world;
  world.reserve(ranks.size());
  for (int r : ranks) world.push_back(world_ranks_[r]);
  const int group_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  return std::make_shared<GlooCommunicator>(store_, device_, prefix_ + "/" + name, group_rank,
                                            std::move(world), options_);
}

std::shared_ptr<Communicator> GlooCommunicator::new_group(const std::vector<int>& ranks) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    check_peer(ranks[i], size(), "new_group", "rank");
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      throw CommError("tandem: new_group: ranks " + format_ranks(ranks) +
                      " must be sorted and unique.");
    }
  }
  if (ranks.empty()) throw CommError("tandem: new_group: the rank list is empty.");
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_group_++;
  }
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) return nullptr;
  // The member list is part of the key: ranks that disagree on it never meet and time out.
  return make_group(ranks, "group" + std::to_string(id) + format_ranks(ranks));
}

std::shared_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  at::Tensor mine = at::empty({2}, at::kLong);
  mine.data_ptr<int64_t>()[0] = color;
  mine.data_ptr<int64_t>()[1] = key;
  at::Tensor all = at::empty({2 * size()}, at::kLong);
  allgather(all, mine)->wait();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_group_++;
  }
  if (color < 0) return nullptr;
  const int64_t* v = all.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int>> members;  // (key, rank)
  for (int r = 0; r < size(); ++r) {
    if (v[2 * r] == color) members.emplace_back(v[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;  // group rank = position, i.e. ordered by (key, rank)
  for (const auto& m : members) ranks.push_back(m.second);
  return make_group(ranks, "split" + std::to_string(id) + "/color" + std::to_string(color));
}

}  // namespace tandem
