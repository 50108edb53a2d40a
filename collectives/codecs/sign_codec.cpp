// EF-signSGD (Karimireddy et al. 2019): each tensor is sent as its signs, packed 8 to a byte,
// and one scale, the mean magnitude (scale * sign keeps the tensor's L1 norm). Every rank adds
// all ranks' decoded tensors in rank order and divides by the rank count; the error feedback
// keeps what the 1-bit code lost for the next step.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include "collectives/codecs/codec_kernels.h"
#include "collectives/codecs/codec_state.h"
#include "collectives/codecs/stage_thread.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <vector>

namespace tandem {

namespace {

constexpr const char* kName = "sign";

// Bit b of byte i is the sign (1: >= 0) of entry 8 i + b.
at::Tensor pack_signs(const at::Tensor& values) {
  const int64_t n = values.numel();
  const int64_t bytes = (n + 7) / 8;
  at::Tensor bits = at::zeros({bytes * 8}, values.options().dtype(at::kByte));
  bits.narrow(0, 0, n).copy_(values.ge(0));
  at::Tensor weights = at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, values.options().dtype(at::kByte));
  return bits.view({bytes, 8}).mul_(weights).sum(1, false, at::kByte);
}

// +1 / -1 in `dtype` for the first `n` packed signs.
at::Tensor unpack_signs(const at::Tensor& packed, int64_t n, at::ScalarType dtype) {
  at::Tensor weights = at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, packed.options());
  at::Tensor bits = packed.unsqueeze(1).bitwise_and(weights).ne(0).view({-1}).narrow(0, 0, n);
  return bits.to(dtype).mul_(2).sub_(1);
}

class SignCodec final : public GradCodec {
 public:
  explicit SignCodec(SignOptions options) : options_(options) {}

  std::string name() const override { return kName; }

  std::map<std::string, at::Tensor> state() const override {
    return detail::codec_state(kName, nullptr, {{"residual", &residuals_.residuals()}});
  }

  void load_state(const std::map<std::string, at::Tensor>& state) override {
    detail::load_codec_state(
        kName, state, nullptr,
        {{"residual", [this](int64_t p, at::Tensor t) { residuals_.load(p, std::move(t)); }}});
  }

  void keep_step_undo(bool keep) override { residuals_.keep_undo(keep); }
  void undo_steps_from(int64_t step) override {
    stages_.drain();
    residuals_.undo_from(step, kName);
  }

 protected:
  WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) override {
    return stages_.submit(wire, bucket, [this, &wire, b = bucket] { run(wire, b); });
  }

 private:
  void run(Communicator& wire, const GradBucket& b) {
    const at::Tensor& m = b.buffer;
    const int64_t n = m.numel();
    if (n == 0) return;
    // What is coded: the gradient, or gradient + residual (in the residual's storage, which then
    // keeps what the code lost).
    at::Tensor residual = options_.error_feedback ? residuals_.accumulate(b, kName) : at::Tensor();
    const at::Tensor source = residual.defined() ? residual : m;
    const bool fast = m.is_cpu() && m.scalar_type() == at::kFloat;
    const int64_t tensors = static_cast<int64_t>(b.param_indices.size());
    std::vector<int64_t> sizes(tensors);
    for (int64_t t = 0; t < tensors; ++t) {
      sizes[t] = 1;
      for (int64_t d : b.shapes[t]) sizes[t] *= d;
    }

    // Encode: one scale per tensor (mean |entry|, float32 whatever the dtype) and the signs.
    at::Tensor scales = at::empty({tensors}, m.options().dtype(at::kFloat).device(at::kCPU));
    at::Tensor signs;
    if (fast) {
      const float* x = source.data_ptr<float>();
      for (int64_t t = 0; t < tensors; ++t) {
        scales.data_ptr<float>()[t] = static_cast<float>(
            kernels::sum_magnitudes(x + b.offsets[t], sizes[t]) / static_cast<double>(sizes[t]));
      }
      signs = at::empty({(n + 7) / 8}, m.options().dtype(at::kByte));
      kernels::pack_signs(x, n, signs.data_ptr<uint8_t>());
      if (residual.defined()) {
        for (int64_t t = 0; t < tensors; ++t) {
          kernels::subtract_signs(residual.data_ptr<float>() + b.offsets[t], sizes[t],
                                  signs.data_ptr<uint8_t>(), b.offsets[t],
                                  scales.data_ptr<float>()[t]);
        }
      }
    } else {
      for (int64_t t = 0; t < tensors; ++t) {
        scales[t].copy_(source.narrow(0, b.offsets[t], sizes[t]).abs().mean());
      }
      scales = scales.to(m.device());
      signs = pack_signs(source);
      if (residual.defined()) residual.sub_(decode(signs, scales, sizes, n, m.scalar_type()));
    }

    const int ranks = wire.size();
    at::Tensor all_signs = at::empty({ranks * signs.numel()}, signs.options());
    at::Tensor all_scales = at::empty({ranks * tensors}, scales.options());
    WorkPtr sign_work = wire.allgather(all_signs, signs);
    WorkPtr scale_work = wire.allgather(all_scales, scales);
    sign_work->wait();
    scale_work->wait();

    // Decode: the average of every rank's code, summed in rank order (same bits everywhere).
    for (int r = 0; r < ranks; ++r) {
      const at::Tensor rank_signs = all_signs.narrow(0, r * signs.numel(), signs.numel());
      const at::Tensor rank_scales = all_scales.narrow(0, r * tensors, tensors);
      if (fast) {
        for (int64_t t = 0; t < tensors; ++t) {
          kernels::add_signs(m.data_ptr<float>() + b.offsets[t], sizes[t],
                             rank_signs.data_ptr<uint8_t>(), b.offsets[t],
                             rank_scales.data_ptr<float>()[t] / static_cast<float>(ranks), r > 0);
        }
      } else {
        at::Tensor code = decode(rank_signs, rank_scales.div(ranks), sizes, n, m.scalar_type());
        r == 0 ? m.copy_(code) : m.add_(code);
      }
    }
  }

  // scale[t] * (+1 / -1) for every entry of tensor t, as one flat tensor of `n` entries.
  static at::Tensor decode(const at::Tensor& signs, const at::Tensor& scales,
                           const std::vector<int64_t>& sizes, int64_t n, at::ScalarType dtype) {
    at::Tensor repeats = at::tensor(sizes, scales.options().dtype(at::kLong));
    return unpack_signs(signs, n, dtype).mul_(at::repeat_interleave(scales.to(dtype), repeats, 0, n));
  }

  SignOptions options_;
  detail::ResidualBank residuals_;
  detail::StageThread stages_{kName};  // last: joined first, while the state above still lives
};

}  // namespace

std::shared_ptr<GradCodec> make_sign_codec(SignOptions options) {
  return std::make_shared<SignCodec>(options);
}

}  // namespace tandem
