#include <tandem/collectives/grad_codec.h>

#include <atomic>

namespace tandem {

namespace {

class AverageCodec final : public GradCodec {
 public:
  std::string name() const override { return "average"; }

  WorkPtr reduce(Communicator& comm, GradBucket& bucket) override {
    if (bucket.index == 0) bytes_this_step_ = 0;
    const uint64_t bytes = static_cast<uint64_t>(bucket.buffer.numel()) *
                           bucket.buffer.element_size();
    // A ring all-reduce sends 2 (n-1)/n of the buffer from each rank.
    const int n = comm.size();
    bytes_this_step_ += n > 1 ? bytes * 2 * (n - 1) / n : 0;
    bytes_last_step_ = bytes_this_step_.load();
    return comm.allreduce(bucket.buffer, ReduceOp::kAvg);
  }

  uint64_t bytes_sent_last_step() const override { return bytes_last_step_; }

 private:
  std::atomic<uint64_t> bytes_this_step_{0};
  std::atomic<uint64_t> bytes_last_step_{0};
};

}  // namespace

std::shared_ptr<GradCodec> make_average_codec() { return std::make_shared<AverageCodec>(); }

}  // namespace tandem
