// DeviceRoutingCommunicator (include/tandem/collectives/device_routing_communicator.h).
#include <tandem/collectives/device_routing_communicator.h>

#include <tandem/base/errors.h>

#include <memory>
#include <string>
#include <utility>

namespace tandem {

DeviceRoutingCommunicator::DeviceRoutingCommunicator(std::shared_ptr<Communicator> cpu,
                                                     std::shared_ptr<Communicator> cuda)
    : cpu_(std::move(cpu)), cuda_(std::move(cuda)) {
  if (!cpu_ || !cuda_) throw ConfigError("tandem: DeviceRoutingCommunicator: a communicator is null.");
  if (cpu_->rank() != cuda_->rank() || cpu_->size() != cuda_->size()) {
    throw ConfigError("tandem: DeviceRoutingCommunicator: the CPU and CUDA communicators are rank " +
                      std::to_string(cpu_->rank()) + " of " + std::to_string(cpu_->size()) +
                      " and rank " + std::to_string(cuda_->rank()) + " of " +
                      std::to_string(cuda_->size()) + "; they must span the same ranks.");
  }
}

Communicator& DeviceRoutingCommunicator::route(const at::Tensor& out, const at::Tensor& in,
                                               const char* op) const {
  if (out.is_cuda() != in.is_cuda()) {
    throw CommError(std::string("tandem: ") + op + ": the output is on " + out.device().str() +
                    " and the input on " + in.device().str() + "; put both on one device.");
  }
  return route(in);
}

WorkPtr DeviceRoutingCommunicator::allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire,
                                                      int divisor) {
  if (tensor.is_cuda()) return nullptr;
  return cpu_->narrowed_allreduce()->allreduce_narrowed(tensor, wire, divisor);
}

WorkPtr DeviceRoutingCommunicator::do_allreduce(const at::Tensor& tensor, ReduceOp op) {
  return route(tensor).allreduce(tensor, op);
}

WorkPtr DeviceRoutingCommunicator::do_broadcast(const at::Tensor& tensor, int root) {
  return route(tensor).broadcast(tensor, root);
}

WorkPtr DeviceRoutingCommunicator::do_allgather(const at::Tensor& output, const at::Tensor& input) {
  return route(output, input, "allgather").allgather(output, input);
}

WorkPtr DeviceRoutingCommunicator::do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                  ReduceOp op) {
  return route(output, input, "reduce_scatter").reduce_scatter(output, input, op);
}

WorkPtr DeviceRoutingCommunicator::do_send(const at::Tensor& tensor, int dst, uint32_t tag) {
  return route(tensor).send(tensor, dst, tag);
}

WorkPtr DeviceRoutingCommunicator::do_recv(const at::Tensor& tensor, int src, uint32_t tag) {
  return route(tensor).recv(tensor, src, tag);
}

WorkPtr DeviceRoutingCommunicator::do_send_recv(const std::vector<P2POp>& ops) {
  if (ops.empty()) return cpu_->send_recv(ops);
  for (const P2POp& op : ops) {
    if (op.tensor.is_cuda() != ops.front().tensor.is_cuda()) {
      throw CommError("tandem: send_recv: a batch holds tensors on " +
                      ops.front().tensor.device().str() + " and on " + op.tensor.device().str() +
                      "; post one batch per device.");
    }
  }
  return route(ops.front().tensor).send_recv(ops);
}

std::shared_ptr<Communicator> DeviceRoutingCommunicator::do_new_group(const std::vector<int>& ranks) {
  auto cpu = cpu_->new_group(ranks);
  auto cuda = cuda_->new_group(ranks);
  if (!cpu) return nullptr;  // this rank is not in `ranks`
  return std::make_shared<DeviceRoutingCommunicator>(std::move(cpu), std::move(cuda));
}

std::shared_ptr<Communicator> DeviceRoutingCommunicator::split(int color, int key) {
  auto cpu = cpu_->split(color, key);
  auto cuda = cuda_->split(color, key);
  if (!cpu) return nullptr;
  return std::make_shared<DeviceRoutingCommunicator>(std::move(cpu), std::move(cuda));
}

void DeviceRoutingCommunicator::abort(const std::string& reason) {
  cpu_->abort(reason);
  cuda_->abort(reason);
}

}  // namespace tandem
