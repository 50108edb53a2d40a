// PowerSGD (Vogels, Karimireddy, Jaggi 2019): each gradient, viewed as a rows x cols matrix M,
// is sent as two thin factors. With Q (cols x r) shared by every rank: P = M Q is summed over
// ranks and orthonormalised, Q = M^T P is averaged, and every rank decodes P Q^T, the projection
// of the average gradient onto span(P). Error feedback keeps M - P Q^T for the next step.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include "collectives/codecs/codec_state.h"
#include "collectives/codecs/stage_thread.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/normal.h>

#include <algorithm>
#include <vector>

namespace tandem {

namespace {

constexpr const char* kName = "powersgd";

// Modified Gram-Schmidt with reorthogonalisation on the columns of `p` (rows x r, float32 or
// float64), in place. One pass loses orthogonality in proportion to P's condition number, which
// a warm-started Q squares; with error feedback the loss compounds from step to step (measured:
// 8.5 ulps of float32 after three steps under OpenBLAS's Haswell kernels). Projecting each
// column out twice ("twice is enough", Giraud et al. 2005) keeps it at 2-3 ulps on every kernel.
// A column that is (numerically) zero stays zero instead of becoming NaN, so rank-deficient
// gradients and low-precision factors decode to finite values.
void orthonormalize_columns(const at::Tensor& p) {
  const int64_t r = p.size(1);
  for (int64_t i = 0; i < r; ++i) {
    at::Tensor col = p.select(1, i);
    col.div_(col.norm().clamp_min(1e-30));
    if (i + 1 < r) {
      at::Tensor rest = p.narrow(1, i + 1, r - i - 1);
      for (int pass = 0; pass < 2; ++pass) {
        rest.sub_(at::mm(col.unsqueeze(1), at::mm(col.unsqueeze(0), rest)));
      }
    }
  }
}

class PowerSgdCodec final : public GradCodec {
 public:
  explicit PowerSgdCodec(PowerSgdOptions options) : options_(options) {
    if (options_.rank < 1) {
      throw ConfigError("tandem: powersgd: rank must be at least 1, got " +
                        std::to_string(options_.rank) + ".");
    }
    if (options_.start_iter < 0) {
      throw ConfigError("tandem: powersgd: start_iter must be >= 0, got " +
                        std::to_string(options_.start_iter) + ".");
    }
    if (!(options_.min_compression_rate >= 0)) {
      throw ConfigError("tandem: powersgd: min_compression_rate must be >= 0, got " +
                        std::to_string(options_.min_compression_rate) + ".");
    }
  }

  std::string name() const override { return kName; }

  std::map<std::string, at::Tensor> state() const override {
    return detail::codec_state(kName, &step_, {{"q", &q_}, {"error", &errors_.residuals()}});
  }

  void load_state(const std::map<std::string, at::Tensor>& state) override {
    q_before_.clear();  // what is loaded is the state before any step to undo
    detail::load_codec_state(
        kName, state, &step_,
        {{"q", [this](int64_t p, at::Tensor t) { q_[p] = std::move(t); }},
         {"error", [this](int64_t p, at::Tensor t) { errors_.load(p, std::move(t)); }}});
  }

  void keep_step_undo(bool keep) override {
    keep_undo_ = keep;
    errors_.keep_undo(keep);
  }
  void undo_steps_from(int64_t step) override {
    stages_.drain();
    errors_.undo_from(step, kName);
    for (auto it = q_before_.begin(); it != q_before_.end();) {
      if (it->second.step < step) {
        ++it;
        continue;
      }
      if (it->second.q.defined()) {
        q_[it->first] = it->second.q;
      } else {
        q_.erase(it->first);
      }
      it = q_before_.erase(it);
    }
    step_.undo_from(step);
  }

 protected:
  WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) override {
    const int64_t step = step_.at(bucket);
    if (step < options_.start_iter) return wire.allreduce(bucket.buffer, ReduceOp::kAvg);
    // The job owns a copy of the bucket's description (the tensors are shared handles).
    return stages_.submit(wire, bucket, [this, &wire, b = bucket, step] { run(wire, b, step); });
  }

 private:
  struct Matrix {
    int64_t param, rows, cols, rank;
    at::Tensor grad;   // rows x cols view of the bucket buffer
    at::Tensor m;      // what is compressed: grad, or grad + residual (in the residual's storage)
    at::Tensor p, q;   // views of the batched factors
  };

  void run(Communicator& wire, const GradBucket& b, int64_t step) {
    const at::ScalarType dtype = b.buffer.scalar_type();
    // Factors are computed in float32 at least: orthonormalisation is unstable in 16 bits.
    const at::ScalarType compute = dtype == at::kDouble ? at::kDouble : at::kFloat;
    // The residual before this step, and where the one after it goes (error feedback).
    detail::ResidualBank::Step residual;
    if (options_.error_feedback) residual = errors_.step(b, b.step, kName);

    std::vector<Matrix> matrices;
    std::vector<at::Tensor> plain;  // flat views of the tensors sent uncompressed
    int64_t p_elems = 0, q_elems = 0;
    for (size_t slot = 0; slot < b.param_indices.size(); ++slot) {
      const auto& shape = b.shapes[slot];
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      at::Tensor flat = b.buffer.narrow(0, b.offsets[slot], numel);
      const int64_t rows = shape.size() >= 2 ? shape[0] : 0;
      const int64_t cols = rows > 0 ? numel / rows : 0;
      const int64_t r = std::min({options_.rank, rows, cols});
      const bool compress = rows > 0 && cols > 0 &&
                            static_cast<double>((rows + cols) * r) * options_.min_compression_rate <
                                static_cast<double>(rows * cols);
      if (!compress) {
        plain.push_back(flat);
        continue;
      }
      Matrix mat{b.param_indices[slot], rows, cols, r, flat.view({rows, cols}), {}, {}, {}};
      if (residual.after.defined()) {
        // M = gradient + what earlier steps did not transmit
        mat.m = residual.after.narrow(0, b.offsets[slot], numel).view({rows, cols});
        at::add_out(mat.m, residual.before.narrow(0, b.offsets[slot], numel).view({rows, cols}),
                    mat.grad);
      } else {
        mat.m = mat.grad;
      }
      p_elems += rows * r;
      q_elems += cols * r;
      matrices.push_back(std::move(mat));
    }

    // Tensors too small to gain go in one uncompressed all-reduce, overlapped with P's.
    at::Tensor plain_batch;
    WorkPtr plain_work;
    if (!plain.empty()) {
      plain_batch = at::cat(plain);
      plain_work = wire.allreduce(plain_batch, ReduceOp::kAvg);
    }
    if (!matrices.empty()) {
      at::Tensor ps = at::empty({p_elems}, b.buffer.options().dtype(compute));
      at::Tensor qs = at::empty({q_elems}, b.buffer.options().dtype(compute));
      int64_t po = 0, qo = 0;
      for (Matrix& mat : matrices) {
        mat.p = ps.narrow(0, po, mat.rows * mat.rank).view({mat.rows, mat.rank});
        mat.q = qs.narrow(0, qo, mat.cols * mat.rank).view({mat.cols, mat.rank});
        po += mat.rows * mat.rank;
        qo += mat.cols * mat.rank;
      }
      const std::vector<at::Tensor> start = start_qs(matrices, step, b.step, compute);
      for (size_t i = 0; i < matrices.size(); ++i) {
        at::mm_out(matrices[i].p, as(matrices[i].m, compute), start[i]);
      }
      wire.allreduce(ps, ReduceOp::kSum)->wait();
      for (Matrix& mat : matrices) {
        orthonormalize_columns(mat.p);
        at::mm_out(mat.q, as(mat.m, compute).t(), mat.p);
      }
      wire.allreduce(qs, ReduceOp::kAvg)->wait();
      for (Matrix& mat : matrices) {
        if (compute == dtype) {
          at::mm_out(mat.grad, mat.p, mat.q.t());
        } else {
          mat.grad.copy_(at::mm(mat.p, mat.q.t()));
        }
        if (residual.after.defined()) mat.m.sub_(mat.grad);  // residual = M - decoded
        if (options_.warm_start) {
          keep_q_before(mat.param, b.step);
          q_[mat.param].copy_(mat.q);
        }
      }
    }
    if (plain_work) {
      plain_work->wait();
      int64_t offset = 0;
      for (at::Tensor& t : plain) {
        t.copy_(plain_batch.narrow(0, offset, t.numel()));
        offset += t.numel();
      }
    }
  }

  static at::Tensor as(const at::Tensor& t, at::ScalarType dtype) {
    return t.scalar_type() == dtype ? t : t.to(dtype);
  }

  // Q of every matrix for this step: last step's (warm start), kept on the factors' device, or a
  // fresh one drawn from a CPU generator every rank seeds alike (seed, parameter and, without warm
  // start, step) - the same numbers on every rank whatever its device - then copied to the device
  // in one transfer for the whole bucket and orthonormalised there.
  std::vector<at::Tensor> start_qs(const std::vector<Matrix>& matrices, int64_t step,
                                   int64_t bucket_step, at::ScalarType compute) {
    std::vector<at::Tensor> out(matrices.size());
    std::vector<size_t> fresh;
    int64_t fresh_elems = 0;
    for (size_t i = 0; i < matrices.size(); ++i) {
      const Matrix& mat = matrices[i];
      auto found = q_.find(mat.param);
      if (!options_.warm_start || found == q_.end()) {
        fresh.push_back(i);
        fresh_elems += mat.cols * mat.rank;
        continue;
      }
      if (found->second.sizes() != mat.q.sizes()) {
        throw ConfigError("tandem: powersgd: the saved Q factor of parameter " +
                          std::to_string(mat.param) + " has shape " +
                          c10::str(found->second.sizes()) + ", expected " +
                          c10::str(mat.q.sizes()) +
                          ". The codec state was saved with another model or rank; resume with "
                          "the same model and powersgd rank.");
      }
      // A loaded Q arrives on the host: moved once, not copied at every step.
      if (found->second.device() != mat.q.device() || found->second.scalar_type() != compute) {
        found->second = found->second.to(mat.q.options());
      }
      out[i] = found->second;
    }
    if (fresh.empty()) return out;
    // Pinned for a device: the one copy is then queued, not waited for by the host (libtorch's
    // pinned allocator keeps the buffer until the copy is done).
    const bool device = !matrices[fresh.front()].q.is_cpu();
    at::Tensor host = at::empty({fresh_elems}, at::TensorOptions().dtype(compute).pinned_memory(device));
    int64_t offset = 0;
    for (size_t i : fresh) {
      const Matrix& mat = matrices[i];
      uint64_t seed = options_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(mat.param);
      if (!options_.warm_start) seed = seed * 0xBF58476D1CE4E5B9ull + static_cast<uint64_t>(step);
      at::Generator gen = at::detail::createCPUGenerator(seed);
      at::Tensor q = host.narrow(0, offset, mat.cols * mat.rank).view({mat.cols, mat.rank});
      at::normal_out(q, 0.0, 1.0, q.sizes(), gen);
      offset += mat.cols * mat.rank;
    }
    const at::Tensor copied = host.to(matrices[fresh.front()].q.options(), /*non_blocking=*/true);
    offset = 0;
    for (size_t i : fresh) {
      const Matrix& mat = matrices[i];
      at::Tensor q = copied.narrow(0, offset, mat.cols * mat.rank).view({mat.cols, mat.rank});
      offset += mat.cols * mat.rank;
      orthonormalize_columns(q);
      if (options_.warm_start) {
        keep_q_before(mat.param, bucket_step);
        q_[mat.param] = q.clone();
      }
      out[i] = q;
    }
    return out;
  }

  // With undo kept: parameter `param`'s Q as it was before reducer step `step` changes it.
  void keep_q_before(int64_t param, int64_t step) {
    if (!keep_undo_) return;
    auto& before = q_before_[param];
    if (before.step == step) return;
    auto q = q_.find(param);
    before = {step, q == q_.end() ? at::Tensor() : q->second.clone()};
  }

  PowerSgdOptions options_;
  detail::CodecStep step_;
  detail::ResidualBank errors_;
  std::map<int64_t, at::Tensor> q_;
  // With undo kept (keep_step_undo): each Q before the latest step that changed it (undefined:
  // there was none).
  struct QBefore {
    int64_t step = -1;
    at::Tensor q;
  };
  std::map<int64_t, QBefore> q_before_;
  bool keep_undo_ = false;
  detail::StageThread stages_{kName};  // last: joined first, while the state above still lives
};

}  // namespace

std::shared_ptr<GradCodec> make_powersgd_codec(PowerSgdOptions options) {
  return std::make_shared<PowerSgdCodec>(options);
}

}  // namespace tandem
