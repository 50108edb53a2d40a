// Internal: the communicators a GradCodec talks through. Each wraps another communicator and
// forwards every op; CountingCommunicator adds up the bytes this rank sends (as the ring
// algorithms send them), CastingCommunicator sends floating tensors in a lower precision and
// writes the result back in the caller's dtype. Both live as long as their codec.
#pragma once

#include <tandem/collectives/communicator.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace tandem::detail {

// Forwards every op to `inner` unchanged; subclasses override what they change.
class ForwardingCommunicator : public Communicator, public NarrowedAllreduce {
 public:
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  int world_rank(int group_rank) const override { return inner_.world_rank(group_rank); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  bool p2p_tags(c10::Device device) const override { return inner_.p2p_tags(device); }
  std::shared_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& reason) override { inner_.abort(reason); }

  Communicator& inner() const { return inner_; }
  Communicator* underlying() override { return &inner_; }

  // The capability of the communicator underneath (through any wrappers), through this one, so
  // that a subclass sees the op (CountingCommunicator counts it).
  NarrowedAllreduce* narrowed_allreduce() override {
    return inner_.narrowed_allreduce() != nullptr ? this : nullptr;
  }
  // The op of the communicator underneath; null where it has none or cannot take this call.
  WorkPtr allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire, int divisor) override;

 protected:
  // Each op to the inner communicator's, unchanged (its checks run again there: a wrapper may
  // change what it passes on).
  WorkPtr do_allreduce(const at::Tensor& tensor, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override;
  WorkPtr do_allgather(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  WorkPtr do_send(const at::Tensor& tensor, int dst, uint32_t tag) override;
  WorkPtr do_recv(const at::Tensor& tensor, int src, uint32_t tag) override;
  WorkPtr do_barrier() override { return inner_.barrier(); }
  WorkPtr do_fence() override { return inner_.fence(); }
  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override;

  Communicator& inner_;
};

// Counts the bytes this rank sends: all-reduce 2(n-1)/n of the tensor, all-gather and
// reduce-scatter (n-1)/n of the gathered/scattered whole, broadcast and send the tensor.
class CountingCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;

  WorkPtr allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire, int divisor) override;

  // What an all-reduce of `bytes` sends from each of `ranks` ranks.
  static uint64_t allreduce_bytes(uint64_t bytes, int ranks);

  void start_step() { sent_ = 0; }
  uint64_t sent() const { return sent_; }

 private:
  WorkPtr do_allreduce(const at::Tensor& tensor, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override;
  WorkPtr do_allgather(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  WorkPtr do_send(const at::Tensor& tensor, int dst, uint32_t tag) override;

  std::atomic<uint64_t> sent_{0};
};

// Floating tensors travel as `wire_dtype` (float16 or bfloat16): all-reduce kAvg and
// reduce-scatter kAvg divide by the rank count before the cast (in the same pass), so a sum of n
// values cannot overflow where their average does not. Results are copied back into the caller's
// tensors when the op's Work is waited for. Other dtypes pass unchanged. The wire copy of a
// tensor is kept while the tensor's storage lives (gradient buckets are long-lived), so a cast
// costs one pass and no fresh pages. A float32 sum or average the communicator underneath can
// fuse with the casts (allreduce_narrowed: shared memory) needs no wire copy at all.
class CastingCommunicator final : public ForwardingCommunicator {
 public:
  CastingCommunicator(Communicator& inner, at::ScalarType wire_dtype)
      : ForwardingCommunicator(inner), wire_dtype_(wire_dtype) {}

  at::ScalarType wire_dtype() const { return wire_dtype_; }

 private:
  WorkPtr do_allreduce(const at::Tensor& tensor, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override;
  WorkPtr do_allgather(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;

  bool casts(const at::Tensor& t) const;
  at::Tensor wire_copy(const at::Tensor& t);

  struct WireCopy {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t offset = 0;
    at::Tensor copy;
  };
  at::ScalarType wire_dtype_;
  std::mutex mutex_;
  std::vector<WireCopy> copies_;
};

// A Work that runs `then` once, on the waiting thread, after `inner` completed.
class ContinuationWork final : public Work {
 public:
  ContinuationWork(WorkPtr inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait(std::chrono::milliseconds timeout = kDefaultTimeout) override;
  bool is_completed() override { return done_; }
  std::string describe() const override { return inner_->describe(); }

 private:
  WorkPtr inner_;
  std::function<void()> then_;
  std::once_flag once_;
  std::atomic<bool> done_{false};
};

}  // namespace tandem::detail
