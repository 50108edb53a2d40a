// Top-k sparsification with error feedback: each rank sends the k largest-magnitude entries of
// its bucket (plus what earlier steps left behind) as (index, value) pairs; every rank adds all
// ranks' pairs in rank order and divides by the rank count. What was not sent stays in the
// residual for the next step.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include "collectives/codecs/codec_kernels.h"
#include "collectives/codecs/codec_state.h"
#include "collectives/codecs/stage_thread.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem {

namespace {

constexpr const char* kName = "topk";

// Indices of the k largest |m| (int64): radix selection for float32 on the CPU, ATen's topk
// elsewhere.
at::Tensor top_magnitudes(const at::Tensor& m, int64_t k) {
  if (m.is_cpu() && m.scalar_type() == at::kFloat) {
    return at::tensor(kernels::top_magnitudes(m.data_ptr<float>(), m.numel(), k), at::kLong);
  }
  return std::get<1>(at::topk(m.abs(), k, 0, /*largest=*/true, /*sorted=*/false));
}

class TopKCodec final : public GradCodec {
 public:
  explicit TopKCodec(TopKOptions options) : options_(options) {
    if (!(options_.ratio > 0 && options_.ratio <= 1)) {
      throw ConfigError("tandem: topk: ratio must be in (0, 1], got " +
                        std::to_string(options_.ratio) + " (e.g. 0.01 sends 1% of the entries).");
    }
    if (options_.warmup_steps < 0) {
      throw ConfigError("tandem: topk: warmup_steps must be >= 0, got " +
                        std::to_string(options_.warmup_steps) + ".");
    }
  }

  std::string name() const override { return kName; }

  std::map<std::string, at::Tensor> state() const override {
    return detail::codec_state(kName, &step_, {{"residual", &residuals_.residuals()}});
  }

  void load_state(const std::map<std::string, at::Tensor>& state) override {
    detail::load_codec_state(
        kName, state, &step_,
        {{"residual", [this](int64_t p, at::Tensor t) { residuals_.load(p, std::move(t)); }}});
  }

  void keep_step_undo(bool keep) override { residuals_.keep_undo(keep); }
  void undo_steps_from(int64_t step) override {
    stages_.drain();
    residuals_.undo_from(step, kName);
    step_.undo_from(step);
  }

  // The fraction sent at `step`: during warm-up ratio^((step + 1) / (warmup + 1)), from near 1
  // down to `ratio`.
  double ratio_at(int64_t step) const {
    if (step >= options_.warmup_steps) return options_.ratio;
    return std::pow(options_.ratio, static_cast<double>(step + 1) / (options_.warmup_steps + 1));
  }

 protected:
  WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) override {
    const int64_t step = step_.at(bucket);
    return stages_.submit(wire, bucket, [this, &wire, b = bucket, step] { run(wire, b, step); });
  }

 private:
  void run(Communicator& wire, const GradBucket& b, int64_t step) {
    const at::Tensor& m = b.buffer;
    const int64_t n = m.numel();
    if (n == 0) return;
    int64_t entries = 0;  // the gradients' entries: the buffer less its alignment gaps
    for (const auto& shape : b.shapes) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      entries += numel;
    }
    // The shave keeps pow()'s rounding from turning 0.1 * 1000 entries into 101.
    const double wanted = ratio_at(step) * static_cast<double>(entries) * (1 - 1e-12);
    const int64_t k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(wanted)), 1, n);
    // What is sparsified: the gradient, or gradient + residual (computed in the residual's
    // storage, which then keeps what is not sent).
    at::Tensor residual = options_.error_feedback ? residuals_.accumulate(b, kName) : at::Tensor();
    const at::Tensor source = residual.defined() ? residual : m;
    at::Tensor indices = top_magnitudes(source, k);
    at::Tensor values = source.index_select(0, indices);
    if (residual.defined()) residual.index_fill_(0, indices, 0);  // what is sent leaves it
    // int32 indices halve their bytes whenever the bucket allows.
    if (n <= std::numeric_limits<int32_t>::max()) indices = indices.to(at::kInt);

    const int ranks = wire.size();
    at::Tensor all_indices = at::empty({ranks * k}, indices.options());
    at::Tensor all_values = at::empty({ranks * k}, values.options());
    WorkPtr index_work = wire.allgather(all_indices, indices);
    WorkPtr value_work = wire.allgather(all_values, values);
    index_work->wait();
    value_work->wait();
    // Each rank's pairs added in rank order: same bits on every rank and every run. Within one
    // rank the indices are distinct, so a gather, an add and a scatter per rank need no atomics
    // (index_add_ over all ranks at once adds duplicates in a different order each run on CUDA).
    m.zero_();
    const at::Tensor longs = all_indices.to(at::kLong);
    for (int r = 0; r < ranks; ++r) {
      const at::Tensor idx = longs.narrow(0, r * k, k);
      m.index_copy_(0, idx, m.index_select(0, idx).add_(all_values.narrow(0, r * k, k)));
    }
    m.div_(ranks);
  }

  TopKOptions options_;
  detail::CodecStep step_;
  detail::ResidualBank residuals_;
  detail::StageThread stages_{kName};  // last: joined first, while the state above still lives
};

}  // namespace

std::shared_ptr<GradCodec> make_topk_codec(TopKOptions options) {
  return std::make_shared<TopKCodec>(options);
}

}  // namespace tandem
