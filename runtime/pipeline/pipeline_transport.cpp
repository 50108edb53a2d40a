// How pipeline ranks talk: the send thread, and small collectives over vectors of numbers that
// construction, the step check and the statistics use.
#include <ATen/ops/empty.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>
#include <optional>

#include "runtime/pipeline/pipeline_impl.h"

namespace tandem::detail {

at::Tensor longs(const std::vector<int64_t>& v) {
  auto t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

std::vector<int64_t> allgather_longs(Communicator& comm, const std::vector<int64_t>& mine) {
  auto in = longs(mine);
  auto out = at::empty({static_cast<int64_t>(mine.size()) * comm.size()}, at::kLong);
  comm.allgather(out, in)->wait();
  const int64_t* p = out.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + out.numel());
}

std::vector<double> allreduce_doubles(Communicator& comm, const std::vector<double>& mine) {
  auto t = at::empty({static_cast<int64_t>(mine.size())}, at::kDouble);
  std::memcpy(t.data_ptr<double>(), mine.data(), mine.size() * sizeof(double));
  if (!mine.empty()) comm.allreduce(t, ReduceOp::kSum)->wait();
  const double* p = t.data_ptr<double>();
  return std::vector<double>(p, p + mine.size());
}

void SendThread::send(at::Tensor tensor, int peer, uint32_t tag) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
  }
  // The producer's stream: a send on a device waits for what this thread queued there.
  std::optional<c10::Stream> producer;
  if (!tensor.is_cpu()) {
    producer = c10::impl::VirtualGuardImpl(tensor.device().type()).getStream(tensor.device());
  }
  executor_.submit([this, tensor = std::move(tensor), peer, tag, producer] {
    WorkPtr work;
    std::exception_ptr error;
    try {
      std::optional<c10::StreamGuard> on_producer;
      if (producer) on_producer.emplace(*producer);
      work = comm_->send(tensor, peer, tag);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (work) posted_.emplace_back(std::move(work), tensor);
    if (error && !error_) error_ = error;
  });
}

void SendThread::drain() {
  executor_.drain();
  std::vector<std::pair<WorkPtr, at::Tensor>> posted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    posted.swap(posted_);
  }
  for (auto& [work, tensor] : posted) work->wait();
}

}  // namespace tandem::detail
