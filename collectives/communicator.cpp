#include <tandem/collectives/communicator.h>

#include <tandem/base/errors.h>

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

WorkPtr Communicator::fence() { return std::make_shared<DoneWork>(); }

WorkPtr Communicator::send_recv(const std::vector<P2POp>& ops) {
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
