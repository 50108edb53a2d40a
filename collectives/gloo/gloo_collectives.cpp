// GlooCommunicator's collectives (all-reduce, broadcast, all-gather, reduce-scatter, barrier):
// checked and numbered on the caller's thread, run on the op thread (gloo_communicator.cpp). CUDA
// tensors are staged through pinned host memory (gloo_host_staging.h): the op body then works on
// their host buffers, as on CPU tensors.
#include "collectives/gloo/gloo_communicator.h"

#include "collectives/gloo/gloo_host_staging.h"

#include "collectives/kernels/reduce_kernels.h"
#include "collectives/shm/shm_collectives.h"
#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>

namespace tandem::detail {

namespace {

// Slot prefix of tandem's own reduce-scatter; Gloo's collectives use 0x01..0x08. A slot is the
// prefix in the top byte and the tag below (Gloo's Slot::build).
constexpr uint64_t kReduceScatterSlotPrefix = 0x21;

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

using Use = HostStaging::Use;

// The tensor the op body works on: argument `i`'s host buffer when staged, else the argument.
at::Tensor on_host(const std::shared_ptr<HostStaging>& staging, size_t i, const at::Tensor& t) {
  return staging ? staging->host(i) : t;
}

}  // namespace

WorkPtr GlooCommunicator::do_allreduce(const at::Tensor& tensor, ReduceOp op) {
  check_gloo_tensor(tensor, "allreduce", "tensor");
  // Staged before the op is numbered: a staging error leaves this rank in step with its peers.
  auto staging = HostStaging::begin("allreduce", {{tensor, "tensor", Use::kReadWrite}});
  auto d = describe("allreduce", std::string(to_string(op)) + ", " + tensor_summary(tensor) +
                                     staged_from(tensor));
  const ReduceFn fn = reduce_kernel(tensor.scalar_type(), op);
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  const uint64_t seq = d.seq;
  return enqueue_staged(std::move(d), staging,
                        [this, tensor = on_host(staging, 0, tensor), op, fn, tag, seq] {
    if (tensor.numel() == 0) return;
    at::Tensor buf = contiguous_view(tensor);
    const size_t nbytes = buf.numel() * buf.element_size();
    if (shm_) {
      shm_->allreduce(buf, op, seq);  // divides for avg itself
      copy_back(tensor, buf);
      return;
    }
    if (size() > 1) {
      const bool small = nbytes < options_.ring_threshold_bytes && is_power_of_two(size());
      mesh_->allreduce(buf.data_ptr(), buf.numel(), buf.element_size(), fn, small, tag,
                       options_.timeout);
    }
    if (op == ReduceOp::kAvg) buf.div_(size());
    copy_back(tensor, buf);
  });
}

WorkPtr GlooCommunicator::allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire,
                                             int divisor) {
  if (!shm_ || tensor.scalar_type() != at::kFloat || !tensor.is_cpu() || !tensor.is_contiguous() ||
      (wire != at::kHalf && wire != at::kBFloat16)) {
    return nullptr;
  }
  check_tensor(tensor, "allreduce", "tensor", c10::DeviceType::CPU, "gloo");
  auto d = describe("allreduce", "sum, " + tensor_summary(tensor) + " travelling as " +
                                     dtype_name(wire));
  const uint64_t seq = d.seq;
  return enqueue(std::move(d), [this, tensor, wire, divisor, seq] {
    shm_->allreduce_narrowed(tensor, wire, static_cast<float>(divisor), seq);
  });
}

WorkPtr GlooCommunicator::do_broadcast(const at::Tensor& tensor, int root) {
  check_gloo_tensor(tensor, "broadcast", "tensor");
  // The root only reads its tensor; the others only receive into theirs (Gloo writes all of it).
  auto staging = HostStaging::begin(
      "broadcast", {{tensor, "tensor", rank_ == root ? Use::kRead : Use::kWrite}});
  auto d = describe("broadcast", "root " + std::to_string(root) + ", " + tensor_summary(tensor) +
                                     staged_from(tensor));
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  return enqueue_staged(std::move(d), staging,
                        [this, tensor = on_host(staging, 0, tensor), root, tag] {
    if (tensor.numel() == 0 || size() == 1) return;
    at::Tensor buf = contiguous_view(tensor);
    mesh_->broadcast(buf.data_ptr(), buf.nbytes(), root, tag, options_.timeout);
    if (rank_ != root) copy_back(tensor, buf);
  });
}

WorkPtr GlooCommunicator::do_allgather(const at::Tensor& output, const at::Tensor& input) {
  check_gloo_tensor(output, "allgather", "output");
  check_gloo_tensor(input, "allgather", "input");
  // Separate host buffers: an input inside the output on the device is no alias on the host.
  auto staging = HostStaging::begin(
      "allgather", {{output, "output", Use::kWrite}, {input, "input", Use::kRead}});
  auto d = describe("allgather", tensor_summary(input) + " per rank" + staged_from(input));
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  const uint64_t seq = d.seq;
  return enqueue_staged(std::move(d), staging,
                        [this, output = on_host(staging, 0, output),
                         input = on_host(staging, 1, input), tag, seq] {
    if (input.numel() == 0) return;
    at::Tensor in = contiguous_view(input);
    at::Tensor out = contiguous_view(output);
    if (shm_) {
      // Chunks are written while later parts of the input are still read: an input inside the
      // output anywhere but at this rank's chunk needs its own copy.
      const char* mine = static_cast<const char*>(out.data_ptr()) + rank_ * in.nbytes();
      if (in.is_alias_of(out) && in.data_ptr() != mine) in = in.clone();
      shm_->allgather(out, in, seq);
    } else if (size() == 1) {
      out.view(in.sizes()).copy_(in);
    } else {
      mesh_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), tag, options_.timeout);
    }
    copy_back(output, out);
  });
}

WorkPtr GlooCommunicator::do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                         ReduceOp op) {
  check_gloo_tensor(output, "reduce_scatter", "output");
  check_gloo_tensor(input, "reduce_scatter", "input");
  auto staging = HostStaging::begin(
      "reduce_scatter", {{output, "output", Use::kWrite}, {input, "input", Use::kRead}});
  auto d = describe("reduce_scatter", std::string(to_string(op)) + ", " + tensor_summary(input) +
                                          staged_from(input));
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  const uint64_t seq = d.seq;
  return enqueue_staged(std::move(d), staging,
                        [this, output = on_host(staging, 0, output),
                         input = on_host(staging, 1, input), op, tag, seq] {
    if (shm_ && shm_->reduce_scatter_fits(input.element_size())) {
      at::Tensor in = contiguous_view(input);
      // Our chunk is written while the input is still read: an output inside it needs its own.
      at::Tensor out = output.is_contiguous() && !output.is_alias_of(input)
                           ? output
                           : output.new_empty(output.sizes());
      shm_->reduce_scatter(out, in, op, seq);  // divides for avg itself
      copy_back(output, out);
      return;
    }
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
    auto send_buf = mesh_->buffer(base, chunk_bytes * p);
    auto recv_buf = mesh_->buffer(incoming.data_ptr(), chunk_bytes);
    const int right = (rank_ + 1) % p;
    const int left = (rank_ + p - 1) % p;
    const uint64_t slot = (kReduceScatterSlotPrefix << 56) | tag;
    auto chunk = [p](int c) { return ((c % p) + p) % p; };
    // Step s: pass chunk (r-s-1) right, fold chunk (r-s-2) from the left into ours. After p-1
    // steps chunk r holds the full reduction.
    for (int s = 0; s < p - 1; ++s) {
      const int send_chunk = chunk(rank_ - s - 1);
      const int recv_chunk = chunk(rank_ - s - 2);
      send_buf->send(right, slot, send_chunk * chunk_bytes, chunk_bytes);
      recv_buf->recv(left, slot, 0, chunk_bytes);
      if (!recv_buf->wait_recv(options_.timeout)) throw CommError("receive aborted");
      char* dst = base + recv_chunk * chunk_bytes;
      fn(dst, dst, incoming.data_ptr(), static_cast<size_t>(n));
      if (!send_buf->wait_send(options_.timeout)) throw CommError("send aborted");
    }
  }
  out.copy_(buffer.narrow(0, rank_ * n, n).view(out.sizes()));
}

WorkPtr GlooCommunicator::do_barrier() {
  auto d = describe("barrier", "");
  const uint32_t tag = static_cast<uint32_t>(d.seq);
  return enqueue(std::move(d), [this, tag] {
    if (size() == 1) return;
    mesh_->barrier(tag, options_.timeout);
  });
}

}  // namespace tandem::detail
