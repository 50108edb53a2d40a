#include "tests/support/stream_communicator.h"

#include "base/serial_executor.h"

#include <tandem/base/errors.h>

#include <ATen/ops/ones.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::testing {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kAckTag = 0x7ead0000;  // a receive's answer to its send (tags = false)

class StreamWork final : public Work {
 public:
  StreamWork(std::string what, bool host_waits, std::chrono::milliseconds timeout)
      : what_(std::move(what)), host_waits_(host_waits), timeout_(timeout) {}

  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kDefaultTimeout && !host_waits_) {
      if (error_) std::rethrow_exception(error_);
      return;  // as NCCL's: the caller's stream would wait, the host does not
    }
    if (timeout == kDefaultTimeout) timeout = timeout_;
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      throw TimeoutError("tandem: " + what_ + " (stream) did not complete within " +
                         std::to_string(timeout.count()) + " ms");
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  std::string describe() const override { return what_ + " (stream)"; }

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  const std::string what_;
  const bool host_waits_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class StreamCommunicator final : public Communicator {
 public:
  StreamCommunicator(std::shared_ptr<Communicator> inner, StreamOptions options)
      : inner_(std::move(inner)), options_(std::move(options)), stream_("tandem-test-strm") {}
  ~StreamCommunicator() override { stream_.drain(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend() + "-stream"; }
  int world_rank(int r) const override { return inner_->world_rank(r); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  bool p2p_tags(c10::Device) const override { return options_.tags; }

  WorkPtr do_allreduce(const at::Tensor& t, ReduceOp op) override {
    return run("allreduce", t.nbytes(), [=] { inner_->allreduce(t, op)->wait(); });
  }
  WorkPtr do_broadcast(const at::Tensor& t, int root) override {
    return run("broadcast", t.nbytes(), [=] { inner_->broadcast(t, root)->wait(); });
  }
  WorkPtr do_allgather(const at::Tensor& out, const at::Tensor& in) override {
    return run("allgather", out.nbytes(), [=] { inner_->allgather(out, in)->wait(); });
  }
  WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    return run("reduce_scatter", in.nbytes(), [=] { inner_->reduce_scatter(out, in, op)->wait(); });
  }
  WorkPtr do_send(const at::Tensor& t, int dst, uint32_t tag) override {
    return send_recv({{P2POp::Kind::kSend, t, dst, tag}});
  }
  WorkPtr do_recv(const at::Tensor& t, int src, uint32_t tag) override {
    return send_recv({{P2POp::Kind::kRecv, t, src, tag}});
  }
  WorkPtr do_send_recv(const std::vector<P2POp>& ops) override {
    for (const P2POp& op : ops) {
      if (!options_.tags && op.tag != 0) {
        throw CommError("tandem: " + std::string(op.kind == P2POp::Kind::kSend ? "send" : "recv") +
                        ": tag " + std::to_string(op.tag) +
                        ", but this communicator has no message tags; pass tag 0.");
      }
    }
    const bool rendezvous = !options_.tags;
    size_t bytes = 0;
    for (const P2POp& op : ops) bytes += op.tensor.nbytes();
    return run(ops.size() == 1 ? "point-to-point" : "send_recv", bytes, [this, ops, rendezvous] {
      std::vector<WorkPtr> posted, answers;
      for (const P2POp& op : ops) {
        const bool send = op.kind == P2POp::Kind::kSend;
        posted.push_back(send ? inner_->send(op.tensor, op.peer, op.tag)
                              : inner_->recv(op.tensor, op.peer, op.tag));
        if (rendezvous && send) answers.push_back(inner_->recv(at::ones({1}), op.peer, kAckTag));
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        posted[i]->wait();
        if (rendezvous && ops[i].kind == P2POp::Kind::kRecv) {
          inner_->send(at::ones({1}), ops[i].peer, kAckTag)->wait();
        }
      }
      for (auto& a : answers) a->wait();
    });
  }
  WorkPtr do_barrier() override {
    return run("barrier", 0, [this] { inner_->barrier()->wait(); });
  }
  // As NCCL's: a barrier behind the queued ops, unless waits block until an op ran.
  WorkPtr do_fence() override { return options_.host_waits ? Communicator::do_fence() : barrier(); }
  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override {
    auto g = inner_->new_group(ranks);
    return g ? std::make_shared<StreamCommunicator>(g, options_) : nullptr;
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    auto g = inner_->split(color, key);
    return g ? std::make_shared<StreamCommunicator>(g, options_) : nullptr;
  }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  WorkPtr run(const std::string& name, size_t bytes, std::function<void()> op) {
    auto work = std::make_shared<StreamWork>(name, options_.host_waits, inner_->timeout());
    const auto due = Clock::now() + options_.lag;
    const auto transfer = options_.per_kib * static_cast<int64_t>(bytes / 1024);
    stream_.submit([this, name, work, due, transfer, op = std::move(op)] {
      std::this_thread::sleep_until(due);
      std::exception_ptr error;
      try {
        if (options_.on_start) options_.on_start(name);
        op();
        std::this_thread::sleep_for(transfer);
      } catch (...) {
        error = std::current_exception();
      }
      work->finish(error);
    });
    return work;
  }

  std::shared_ptr<Communicator> inner_;
  const StreamOptions options_;
  SerialExecutor stream_;  // last: drained and joined first
};

}  // namespace

std::shared_ptr<Communicator> make_stream_communicator(std::shared_ptr<Communicator> inner,
                                                       StreamOptions options) {
  if (!inner) throw ConfigError("make_stream_communicator: the inner communicator is null");
  return std::make_shared<StreamCommunicator>(std::move(inner), std::move(options));
}

}  // namespace tandem::testing
