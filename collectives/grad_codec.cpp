#include <tandem/collectives/grad_codec.h>

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include "collectives/codec_wire.h"

namespace tandem {

GradCodec::GradCodec() = default;
GradCodec::~GradCodec() = default;

WorkPtr GradCodec::reduce(Communicator& comm, GradBucket& bucket) {
  if (!wire_) {
    wire_ = std::make_shared<detail::CountingCommunicator>(comm);
  } else if (&wire_->inner() != &comm) {
    throw ConfigError(
        "tandem: gradient codec '" + name() +
        "' was used with a second communicator; its state (residuals, factors) "
        "belongs to one group of ranks. Create one codec per DistributedDataParallel.");
  }
  if (bucket.index == 0) {  // bucket 0 opens every synchronised step
    wire_->start_step();
    uncompressed_bytes_ = 0;
  }
  uncompressed_bytes_ += detail::CountingCommunicator::allreduce_bytes(
      static_cast<uint64_t>(bucket.buffer.numel()) * bucket.buffer.element_size(), comm.size());
  trace::Span span("codec encode", trace::kCodec);  // what runs on the caller's thread
  if (trace::enabled()) span.arg("codec", name()).arg("bucket", bucket.index);
  return encode_and_reduce(*wire_, bucket);
}

void GradCodec::load_state(const std::map<std::string, at::Tensor>& state) {
  if (state.empty()) return;
  throw ConfigError("tandem: gradient codec '" + name() + "' keeps no state, but load_state() got " +
                    std::to_string(state.size()) + " tensor(s), the first named '" +
                    state.begin()->first +
                    "'. The checkpoint was saved with another codec; configure the same codec "
                    "to resume, or drop the codec state.");
}

uint64_t GradCodec::bytes_sent_last_step() const { return wire_ ? wire_->sent() : 0; }

uint64_t GradCodec::uncompressed_bytes_last_step() const { return uncompressed_bytes_; }

double GradCodec::compression_ratio() const {
  const uint64_t sent = bytes_sent_last_step();
  return sent == 0 ? 1.0 : static_cast<double>(uncompressed_bytes_last_step()) / sent;
}

namespace {

class AverageCodec final : public GradCodec {
 public:
  std::string name() const override { return "average"; }

 protected:
  WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) override {
    return wire.allreduce(bucket.buffer, ReduceOp::kAvg);
  }
};

}  // namespace

std::shared_ptr<GradCodec> make_average_codec() { return std::make_shared<AverageCodec>(); }

}  // namespace tandem
