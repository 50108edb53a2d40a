// The cast wrapper: another codec's floating tensors travel in float16 or bfloat16.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include "collectives/codec_wire.h"

namespace tandem {

namespace {

std::string wire_name(at::ScalarType dtype) { return dtype == at::kHalf ? "fp16" : "bf16"; }

}  // namespace

// Not in an anonymous namespace: GradCodec befriends tandem::CastCodec.
class CastCodec final : public GradCodec {
 public:
  CastCodec(at::ScalarType wire_dtype, std::shared_ptr<GradCodec> inner)
      : wire_dtype_(wire_dtype), inner_(std::move(inner)) {
    if (wire_dtype != at::kHalf && wire_dtype != at::kBFloat16) {
      throw ConfigError(std::string("tandem: make_cast_codec: wire dtype ") +
                        c10::toString(wire_dtype) +
                        " is not supported; use at::kHalf (fp16) or at::kBFloat16 (bf16).");
    }
    if (!inner_) throw ConfigError("tandem: make_cast_codec: the inner codec is null.");
  }

  std::string name() const override {
    const std::string inner = inner_->name();
    return inner == "average" ? wire_name(wire_dtype_) : inner + "+" + wire_name(wire_dtype_);
  }
  std::map<std::string, at::Tensor> state() const override { return inner_->state(); }
  void load_state(const std::map<std::string, at::Tensor>& state) override {
    inner_->load_state(state);
  }
  void keep_step_undo(bool keep) override { inner_->keep_step_undo(keep); }
  void undo_steps_from(int64_t step) override { inner_->undo_steps_from(step); }

 protected:
  WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) override {
    if (!casting_ || &casting_->inner() != &wire) {
      casting_ = std::make_unique<detail::CastingCommunicator>(wire, wire_dtype_);
    }
    return inner_->encode_and_reduce(*casting_, bucket);
  }

 private:
  at::ScalarType wire_dtype_;
  std::shared_ptr<GradCodec> inner_;
  std::unique_ptr<detail::CastingCommunicator> casting_;
};

std::shared_ptr<GradCodec> make_cast_codec(at::ScalarType wire_dtype,
                                           std::shared_ptr<GradCodec> inner) {
  return std::make_shared<CastCodec>(wire_dtype, std::move(inner));
}

}  // namespace tandem
