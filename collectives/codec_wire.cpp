#include "collectives/codec_wire.h"

#include "collectives/kernels/cast_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>

#include <algorithm>

namespace tandem::detail {

namespace {

uint64_t nbytes(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

// Whether casts between float32 `high` and `low` can take the CPU kernels of cast_kernels.h.
bool kernel_cast(const at::Tensor& high, const at::Tensor& low) {
  return high.scalar_type() == at::kFloat &&
         (low.scalar_type() == at::kHalf || low.scalar_type() == at::kBFloat16) &&
         high.is_cpu() && low.is_cpu() && high.is_contiguous() && low.is_contiguous() &&
         high.numel() == low.numel();
}

// Elements per task when a cast is split over ATen's intra-op threads.
constexpr int64_t kCastGrain = int64_t{1} << 18;

// low = (high / divisor) rounded to low's dtype.
void narrow_into(at::Tensor low, const at::Tensor& high, int divisor) {
  if (!kernel_cast(high, low)) {
    if (divisor == 1) {
      low.copy_(high);
    } else {
      // Divided in high's precision, then rounded once: the bits of the CPU kernels. libtorch 2.x
      // refuses div_out into a tensor of another dtype.
      low.copy_(at::div(high, divisor));
    }
    return;
  }
  const kernels::CastKernels& k = kernels::cast_kernels();
  const auto narrow = low.scalar_type() == at::kHalf ? k.to_half : k.to_bf16;
  const float* in = high.data_ptr<float>();
  auto* out = static_cast<uint16_t*>(low.data_ptr());
  at::parallel_for(0, high.numel(), kCastGrain, [&](int64_t begin, int64_t end) {
    narrow(in + begin, out + begin, static_cast<size_t>(end - begin), static_cast<float>(divisor));
  });
}

// high = low, widened.
void widen_into(const at::Tensor& high, const at::Tensor& low) {
  if (!kernel_cast(high, low)) {
    high.copy_(low);
    return;
  }
  const kernels::CastKernels& k = kernels::cast_kernels();
  const auto widen = low.scalar_type() == at::kHalf ? k.from_half : k.from_bf16;
  const auto* in = static_cast<const uint16_t*>(low.data_ptr());
  float* out = high.data_ptr<float>();
  at::parallel_for(0, low.numel(), kCastGrain, [&](int64_t begin, int64_t end) {
    widen(in + begin, out + begin, static_cast<size_t>(end - begin));
  });
}

}  // namespace

// ---- ForwardingCommunicator ------------------------------------------------------------------

WorkPtr ForwardingCommunicator::do_allreduce(const at::Tensor& tensor, ReduceOp op) {
  return inner_.allreduce(tensor, op);
}
WorkPtr ForwardingCommunicator::do_broadcast(const at::Tensor& tensor, int root) {
  return inner_.broadcast(tensor, root);
}
WorkPtr ForwardingCommunicator::do_allgather(const at::Tensor& output, const at::Tensor& input) {
  return inner_.allgather(output, input);
}
WorkPtr ForwardingCommunicator::do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                               ReduceOp op) {
  return inner_.reduce_scatter(output, input, op);
}
WorkPtr ForwardingCommunicator::do_send(const at::Tensor& tensor, int dst, uint32_t tag) {
  return inner_.send(tensor, dst, tag);
}
WorkPtr ForwardingCommunicator::do_recv(const at::Tensor& tensor, int src, uint32_t tag) {
  return inner_.recv(tensor, src, tag);
}
WorkPtr ForwardingCommunicator::allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire,
                                                  int divisor) {
  NarrowedAllreduce* below = inner_.narrowed_allreduce();
  return below != nullptr ? below->allreduce_narrowed(tensor, wire, divisor) : nullptr;
}
std::shared_ptr<Communicator> ForwardingCommunicator::do_new_group(const std::vector<int>& ranks) {
  return inner_.new_group(ranks);
}
std::shared_ptr<Communicator> ForwardingCommunicator::split(int color, int key) {
  return inner_.split(color, key);
}

// ---- CountingCommunicator --------------------------------------------------------------------

uint64_t CountingCommunicator::allreduce_bytes(uint64_t bytes, int ranks) {
  return ranks > 1 ? bytes * 2 * static_cast<uint64_t>(ranks - 1) / static_cast<uint64_t>(ranks)
                   : 0;
}

WorkPtr CountingCommunicator::do_allreduce(const at::Tensor& tensor, ReduceOp op) {
  WorkPtr work = inner_.allreduce(tensor, op);  // validates first: a rejected op sends nothing
  sent_ += allreduce_bytes(nbytes(tensor), size());
  return work;
}

WorkPtr CountingCommunicator::do_broadcast(const at::Tensor& tensor, int root) {
  WorkPtr work = inner_.broadcast(tensor, root);
  if (size() > 1) sent_ += nbytes(tensor);
  return work;
}

WorkPtr CountingCommunicator::do_allgather(const at::Tensor& output, const at::Tensor& input) {
  WorkPtr work = inner_.allgather(output, input);
  sent_ += nbytes(input) * static_cast<uint64_t>(size() - 1);
  return work;
}

WorkPtr CountingCommunicator::do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                             ReduceOp op) {
  WorkPtr work = inner_.reduce_scatter(output, input, op);
  sent_ += nbytes(output) * static_cast<uint64_t>(size() - 1);
  return work;
}

WorkPtr CountingCommunicator::do_send(const at::Tensor& tensor, int dst, uint32_t tag) {
  WorkPtr work = inner_.send(tensor, dst, tag);
  sent_ += nbytes(tensor);
  return work;
}

WorkPtr CountingCommunicator::allreduce_narrowed(const at::Tensor& tensor, at::ScalarType wire,
                                                int divisor) {
  WorkPtr work = ForwardingCommunicator::allreduce_narrowed(tensor, wire, divisor);
  if (work) sent_ += allreduce_bytes(tensor.numel() * c10::elementSize(wire), size());
  return work;
}

// ---- CastingCommunicator ---------------------------------------------------------------------

bool CastingCommunicator::casts(const at::Tensor& t) const {
  return t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != wire_dtype_;
}

at::Tensor CastingCommunicator::wire_copy(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  at::Tensor found;
  auto gone = [&](WireCopy& c) {
    c10::intrusive_ptr<c10::StorageImpl> storage = c.storage.lock();
    if (!storage) return true;  // its tensor is gone: drop the copy
    if (storage.get() == t.storage().unsafeGetStorageImpl() && c.offset == t.storage_offset() &&
        c.copy.sizes() == t.sizes()) {
      found = c.copy;
    }
    return false;
  };
  copies_.erase(std::remove_if(copies_.begin(), copies_.end(), gone), copies_.end());
  if (found.defined()) return found;
  at::Tensor copy = at::empty(t.sizes(), t.options().dtype(wire_dtype_));
  copies_.push_back({t.storage().getWeakStorageImpl(), t.storage_offset(), copy});
  return copy;
}

WorkPtr CastingCommunicator::do_allreduce(const at::Tensor& tensor, ReduceOp op) {
  if (!casts(tensor)) return inner_.allreduce(tensor, op);
  // Average as a sum of pre-divided values: n values near the dtype's maximum cannot overflow.
  const bool average = op == ReduceOp::kAvg;
  if (average || op == ReduceOp::kSum) {
    if (WorkPtr fused = ForwardingCommunicator::allreduce_narrowed(tensor, wire_dtype_,
                                                                   average ? size() : 1)) {
      return fused;
    }
  }
  at::Tensor low = wire_copy(tensor);
  narrow_into(low, tensor, average ? size() : 1);
  WorkPtr work = inner_.allreduce(low, average ? ReduceOp::kSum : op);
  return std::make_shared<ContinuationWork>(std::move(work),
                                            [tensor, low] { widen_into(tensor, low); });
}

WorkPtr CastingCommunicator::do_broadcast(const at::Tensor& tensor, int root) {
  if (!casts(tensor)) return inner_.broadcast(tensor, root);
  at::Tensor low = wire_copy(tensor);
  narrow_into(low, tensor, 1);
  WorkPtr work = inner_.broadcast(low, root);
  return std::make_shared<ContinuationWork>(std::move(work),
                                            [tensor, low] { widen_into(tensor, low); });
}

WorkPtr CastingCommunicator::do_allgather(const at::Tensor& output, const at::Tensor& input) {
  if (!casts(input)) return inner_.allgather(output, input);
  at::Tensor low_in = wire_copy(input);
  narrow_into(low_in, input, 1);
  at::Tensor low_out = wire_copy(output);
  WorkPtr work = inner_.allgather(low_out, low_in);
  return std::make_shared<ContinuationWork>(std::move(work),
                                            [output, low_out] { widen_into(output, low_out); });
}

WorkPtr CastingCommunicator::do_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                            ReduceOp op) {
  if (!casts(input)) return inner_.reduce_scatter(output, input, op);
  const bool average = op == ReduceOp::kAvg;
  at::Tensor low_in = wire_copy(input);
  narrow_into(low_in, input, average ? size() : 1);
  at::Tensor low_out = wire_copy(output);
  WorkPtr work = inner_.reduce_scatter(low_out, low_in, average ? ReduceOp::kSum : op);
  return std::make_shared<ContinuationWork>(std::move(work),
                                            [output, low_out] { widen_into(output, low_out); });
}

// ---- ContinuationWork ------------------------------------------------------------------------

void ContinuationWork::wait(std::chrono::milliseconds timeout) {
  inner_->wait(timeout);
  std::call_once(once_, [this] {
    then_();
    done_ = true;
  });
}

}  // namespace tandem::detail
