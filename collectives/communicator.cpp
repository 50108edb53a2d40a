#include <tandem/collectives/communicator.h>

#include <tandem/base/errors.h>
#include <tandem/collectives/flight_recorder.h>

#include "collectives/tensor_checks.h"

#include <memory>
#include <utility>
#include <vector>

namespace tandem {

namespace {

// The Work of ops posted one by one: waits for each in turn.
class BatchWork final : public Work {
 public:
  explicit BatchWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  void wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
  }
  bool is_completed() override {
    for (auto& w : works_) {
      if (!w->is_completed()) return false;
    }
    return true;
  }
  std::string describe() const override {
    std::string s = "batch of " + std::to_string(works_.size()) + " point-to-point ops";
    for (size_t i = 0; i < works_.size(); ++i) s += (i == 0 ? ": " : ", ") + works_[i]->describe();
    return s;
  }

 private:
  std::vector<WorkPtr> works_;
};

// A Work with nothing left to do.
class DoneWork final : public Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
  std::string describe() const override { return "fence (every op completed at its wait)"; }
};

}  // namespace

WorkPtr Communicator::allreduce(const at::Tensor& tensor, ReduceOp op) {
  detail::check_collective_tensor(tensor, "allreduce", "tensor");
  detail::check_reduce_op(tensor, op, "allreduce");
  return do_allreduce(tensor, op);
}

WorkPtr Communicator::broadcast(const at::Tensor& tensor, int root) {
  detail::check_collective_tensor(tensor, "broadcast", "tensor");
  detail::check_peer(root, size(), "broadcast", "root");
  return do_broadcast(tensor, root);
}

WorkPtr Communicator::allgather(const at::Tensor& output, const at::Tensor& input) {
  detail::check_collective_tensor(output, "allgather", "output");
  detail::check_collective_tensor(input, "allgather", "input");
  detail::check_scaled_numel(output, "output", input, "input", size(), "allgather");
  return do_allgather(output, input);
}

WorkPtr Communicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  detail::check_collective_tensor(output, "reduce_scatter", "output");
  detail::check_collective_tensor(input, "reduce_scatter", "input");
  detail::check_scaled_numel(input, "input", output, "output", size(), "reduce_scatter");
  detail::check_reduce_op(input, op, "reduce_scatter");
  return do_reduce_scatter(output, input, op);
}

WorkPtr Communicator::send(const at::Tensor& tensor, int dst, uint32_t tag) {
  detail::check_collective_tensor(tensor, "send", "tensor");
  detail::check_peer(dst, size(), "send", "dst");
  return do_send(tensor, dst, tag);
}

WorkPtr Communicator::recv(const at::Tensor& tensor, int src, uint32_t tag) {
  detail::check_collective_tensor(tensor, "recv", "tensor");
  detail::check_peer(src, size(), "recv", "src");
  return do_recv(tensor, src, tag);
}

WorkPtr Communicator::send_recv(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) {
    const bool is_send = op.kind == P2POp::Kind::kSend;
    detail::check_collective_tensor(op.tensor, is_send ? "send" : "recv", "tensor");
    detail::check_peer(op.peer, size(), is_send ? "send" : "recv", is_send ? "dst" : "src");
  }
  return do_send_recv(ops);
}

WorkPtr Communicator::barrier() { return do_barrier(); }

WorkPtr Communicator::fence() { return do_fence(); }

std::shared_ptr<Communicator> Communicator::new_group(const std::vector<int>& ranks) {
  if (ranks.empty()) throw CommError("tandem: new_group: the rank list is empty.");
  for (size_t i = 0; i < ranks.size(); ++i) {
    detail::check_peer(ranks[i], size(), "new_group", "rank");
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      throw CommError("tandem: new_group: ranks " + detail::format_ranks(ranks) +
                      " must be sorted and unique.");
    }
  }
  return do_new_group(ranks);
}

Communicator::Issued Communicator::issue(const char* name, const std::string& detail, bool p2p) {
  const std::string& ranks = ranks_text();  // set once, then only read
  Issued op;
  std::lock_guard<std::mutex> lock(numbering_mutex_);  // recorded in the order numbered
  op.seq = p2p ? next_p2p_seq_++ : next_collective_seq_++;
  op.flight_id = FlightRecorder::instance().record(ranks, backend(), name, op.seq, p2p, detail);
  return op;
}

const std::string& Communicator::ranks_text() {
  std::lock_guard<std::mutex> lock(numbering_mutex_);
  if (ranks_text_.empty()) {
    std::vector<int> world(size());
    for (int r = 0; r < size(); ++r) world[r] = world_rank(r);
    ranks_text_ = detail::format_ranks(world);
  }
  return ranks_text_;
}

WorkPtr Communicator::do_fence() { return std::make_shared<DoneWork>(); }

WorkPtr Communicator::do_send_recv(const std::vector<P2POp>& ops) {
  std::vector<WorkPtr> works;
  for (const P2POp& op : ops) {
    works.push_back(op.kind == P2POp::Kind::kSend ? send(op.tensor, op.peer, op.tag)
                                                  : recv(op.tensor, op.peer, op.tag));
  }
  return std::make_shared<BatchWork>(std::move(works));
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kProduct}) {
    if (name == to_string(op)) return op;
  }
  throw ConfigError("tandem: unknown reduce op '" + name +
                    "'; expected one of sum, avg, min, max, product.");
}

}  // namespace tandem
