// A Communicator over two others of the same ranks: ops on CUDA tensors go to `cuda` (NCCL), ops
// on CPU tensors and barriers to `cpu` (Gloo). What init() returns for comm.backend = auto or
// nccl on a machine with GPUs, so one world serves a model on the GPU and the checkpoint manager's
// CPU bookkeeping alike.
//
// Each inner communicator keeps its own op order: every rank must issue the same CPU ops in the
// same order, and the same CUDA ops in the same order (as with two communicators). Sub-groups
// split both. fence() is the CUDA communicator's (the CPU one's ops complete at their wait). allgather/reduce_scatter with the input and output on different devices throw
// CommError. The fused narrowed all-reduce (narrowed_allreduce()) is the CPU communicator's, for
// CPU tensors; a CUDA tensor gets null (the caller casts itself).
// Ownership: shares both communicators. Thread-safety: as communicator.h. Errors: those of the
// inner communicators; CommError for mixed-device ops; ConfigError for null or mismatched inners.
#pragma once

#include <tandem/collectives/communicator.h>

#include <memory>
#include <string>
#include <vector>

namespace tandem {

class DeviceRoutingCommunicator final : public Communicator, private NarrowedAllreduce {
 public:
  DeviceRoutingCommunicator(std::shared_ptr<Communicator> cpu, std::shared_ptr<Communicator> cuda);

  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  std::string backend() const override { return cpu_->backend() + "+" + cuda_->backend(); }
  int world_rank(int group_rank) const override { return cpu_->world_rank(group_rank); }
  std::chrono::milliseconds timeout() const override { return cpu_->timeout(); }
  bool p2p_tags(c10::Device device) const override {
    return (device.is_cuda() ? cuda_ : cpu_)->p2p_tags(device);
  }
  std::shared_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& reason) override;
  NarrowedAllreduce* narrowed_allreduce() override {
    return cpu_->narrowed_allreduce() != nullptr ? this : nullptr;
  }

  const std::shared_ptr<Communicator>& cpu() const { return cpu_; }
  const std::shared_ptr<Communicator>& cuda() const { return cuda_; }

 private:
  WorkPtr do_allreduce(const at::Tensor& tensor, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& tensor, int root) override;
  WorkPtr do_allgather(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr do_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  WorkPtr do_send(const at::Tensor& tensor, int dst, uint32_t tag) override;
  WorkPtr do_recv(const at::Tensor& tensor, int src, uint32_t tag) override;
  // Every op of the batch on one kind of device (CommError otherwise).
  WorkPtr do_send_recv(const std::vector<P2POp>& ops) override;
  WorkPtr do_barrier() override { return cpu_->barrier(); }
  WorkPtr do_fence() override { return cuda_->fence(); }
  std::shared_ptr<Communicator> do_new_group(const std::vector<int>& ranks) override;
  Communicator& route(const at::Tensor& t) const { return t.is_cuda() ? *cuda_ : *cpu_; }
  Communicator& route(const at::Tensor& out, const at::Tensor& in, const char* op) const;
  WorkPtr allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire, int divisor) override;

  std::shared_ptr<Communicator> cpu_;
  std::shared_ptr<Communicator> cuda_;
};

}  // namespace tandem
