// EF-signSGD (Karimireddy et al. 2019): each tensor is sent as its signs, packed 8 to a byte,
// and one scale, the mean magnitude (scale * sign keeps the tensor's L1 norm). Every rank adds
// all ranks' decoded tensors in rank order and divides by the rank count; the error feedback
// keeps what the 1-bit code lost for the next step.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include "collectives/codecs/codec_kernels.h"
#include "collectives/codecs/codec_state.h"
#include "collectives/codecs/stage_thread.h"

#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <vector>

namespace tandem {

namespace {

constexpr const char* kName = "sign";

// Bit b of byte i is the sign (1: >= 0) of entry 8 i + b. `weights`: 1, 2, 4, ... 128 as bytes.
at::Tensor pack_signs(const at::Tensor& values, const at::Tensor& weights) {
  const int64_t n = values.numel();
  const int64_t bytes = (n + 7) / 8;
  at::Tensor bits = at::zeros({bytes * 8}, values.options().dtype(at::kByte));
  bits.narrow(0, 0, n).copy_(values.ge(0));
  return bits.view({bytes, 8}).mul_(weights).sum(1, false, at::kByte);
}

// +1 / -1 in `dtype` for the first `n` packed signs.
at::Tensor unpack_signs(const at::Tensor& packed, const at::Tensor& weights, int64_t n,
                        at::ScalarType dtype) {
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
  // What the generic (device) path needs of a bucket's layout, made once per layout on its
  // device, so a step builds no tensor from host numbers (each would be a synchronous copy).
  struct Layout {
    at::Tensor counts;   // float32 [tensors]: each tensor's numel
    at::Tensor segment;  // int64 [n]: each entry's tensor, `tensors` for an alignment gap
    at::Tensor weights;  // uint8 [8]: the bit weights
  };

  const Layout& layout_of(const GradBucket& b, const std::vector<int64_t>& sizes) {
    auto it = layouts_.find(b.param_indices);
    if (it != layouts_.end() && it->second.segment.device() == b.buffer.device()) return it->second;
    const int64_t tensors = static_cast<int64_t>(sizes.size());
    const int64_t n = b.buffer.numel();
    std::vector<int64_t> segment(n, tensors);
    std::vector<float> counts(tensors);
    for (int64_t t = 0; t < tensors; ++t) {
      std::fill_n(segment.begin() + b.offsets[t], sizes[t], t);
      counts[t] = static_cast<float>(sizes[t]);
    }
    const auto on = [&](at::ScalarType dtype) { return b.buffer.options().dtype(dtype); };
    Layout layout;
    layout.counts = at::tensor(counts, at::kFloat).to(on(at::kFloat));
    layout.segment = at::tensor(segment, at::kLong).to(on(at::kLong));
    layout.weights = at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, at::kByte).to(on(at::kByte));
    return layouts_[b.param_indices] = std::move(layout);
  }

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
    at::Tensor scales, signs;
    const Layout* layout = nullptr;
    if (fast) {
      scales = at::empty({tensors}, m.options().dtype(at::kFloat));
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
      // On the bucket's device, without a host read: every tensor's L1 norm in one fused pass.
      layout = &layout_of(b, sizes);
      std::vector<at::Tensor> views;
      for (int64_t t = 0; t < tensors; ++t) views.push_back(source.narrow(0, b.offsets[t], sizes[t]));
      const at::ScalarType accumulate = m.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      scales = at::stack(at::_foreach_norm(views, 1, accumulate)).to(at::kFloat).div_(layout->counts);
      signs = pack_signs(source, layout->weights);
      if (residual.defined()) residual.sub_(decode(signs, scales, *layout, n, m.scalar_type()));
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
        at::Tensor code = decode(rank_signs, rank_scales.div(ranks), *layout, n, m.scalar_type());
        r == 0 ? m.copy_(code) : m.add_(code);
      }
    }
  }

  // scale[t] * (+1 / -1) for every entry of tensor t, 0 in the gaps, as one flat tensor of `n`.
  static at::Tensor decode(const at::Tensor& signs, const at::Tensor& scales, const Layout& layout,
                           int64_t n, at::ScalarType dtype) {
    const at::Tensor per_tensor = at::cat({scales.to(dtype), at::zeros({1}, scales.options().dtype(dtype))});
    return unpack_signs(signs, layout.weights, n, dtype).mul_(per_tensor.index_select(0, layout.segment));
  }

  SignOptions options_;
  detail::ResidualBank residuals_;
  std::map<std::vector<int64_t>, Layout> layouts_;  // by the bucket's parameters (stage thread)
  detail::StageThread stages_{kName};  // last: joined first, while the state above still lives
};

}  // namespace

std::shared_ptr<GradCodec> make_sign_codec(SignOptions options) {
  return std::make_shared<SignCodec>(options);
}

}  // namespace tandem
