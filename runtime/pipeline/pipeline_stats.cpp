// PipelineParallel: accessors, recorded costs and timelines, re-balancing and partitioning
// (pipeline_parallel.h).
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <limits>

#include "runtime/pipeline/pipeline_impl.h"

namespace tandem {

using pipeline::Action;
using pipeline::Op;
using namespace detail;

namespace detail {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t op_index(Op op) {
  switch (op) {
    case Op::kForward:
      return 0;
    case Op::kBackward:
      return 1;
    case Op::kBackwardInput:
      return 2;
    case Op::kBackwardWeight:
      return 3;
    default:
      return -1;
  }
}

}  // namespace detail

std::vector<int64_t> partition_balanced(const std::vector<double>& weights, int parts) {
  const int n = static_cast<int>(weights.size());
  if (parts < 1 || parts > n) {
    throw ConfigError("cannot split " + std::to_string(n) + " layers into " +
                      std::to_string(parts) + " non-empty pipeline stages");
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + std::max(0.0, weights[i]);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[j][i]: minimal largest part splitting the first i layers into j parts.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int j = 1; j <= parts; ++j) {
    for (int i = j; i <= n; ++i) {
      for (int c = j - 1; c < i; ++c) {
        const double v = std::max(best[j - 1][c], prefix[i] - prefix[c]);
        if (v < best[j][i]) {
          best[j][i] = v;
          cut[j][i] = c;
        }
      }
    }
  }
  std::vector<int64_t> sizes(parts);
  int i = n;
  for (int j = parts; j >= 1; --j) {
    sizes[j - 1] = i - cut[j][i];
    i = cut[j][i];
  }
  return sizes;
}

std::vector<at::Tensor> PipelineParallel::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& [s, st] : impl_->stages) {
    for (const auto& p : st.module->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<int> PipelineParallel::local_stages() const {
  std::vector<int> out;
  for (const auto& [s, st] : impl_->stages) out.push_back(s);
  return out;
}

torch::nn::Sequential PipelineParallel::stage_module(int stage) const {
  auto it = impl_->stages.find(stage);
  if (it == impl_->stages.end()) {
    throw ConfigError("stage " + std::to_string(stage) + " is not on pipeline rank " +
                      std::to_string(impl_->rank));
  }
  return it->second.module;
}

const std::vector<int64_t>& PipelineParallel::balance() const { return impl_->balance; }
const pipeline::Schedule& PipelineParallel::schedule() const { return impl_->schedule; }
const std::vector<pipeline::TimedAction>& PipelineParallel::last_timeline() const {
  return impl_->timeline;
}

std::vector<int64_t> PipelineParallel::peak_activation_bytes() const {
  std::vector<int64_t> out;
  for (const auto& [s, st] : impl_->stages) out.push_back(st.peak);
  return out;
}

pipeline::Costs PipelineParallel::measured_costs() {
  Impl& I = *impl_;
  std::vector<double> mine(static_cast<size_t>(I.S) * 8, 0.0);
  for (const auto& [s, st] : I.stages) {
    for (int i = 0; i < 4; ++i) {
      mine[s * 8 + 2 * i] = st.sum[i];
      mine[s * 8 + 2 * i + 1] = static_cast<double>(st.count[i]);
    }
  }
  const auto all = allreduce_doubles(*I.comm, mine);
  pipeline::Costs c;
  auto mean = [&](int s, int i) {
    const double n = all[s * 8 + 2 * i + 1];
    return n > 0 ? all[s * 8 + 2 * i] / n : -1.0;
  };
  for (int s = 0; s < I.S; ++s) {
    const double f = std::max(0.0, mean(s, 0));
    double b = mean(s, 1), i = mean(s, 2), w = mean(s, 3);
    if (i < 0) {  // no I/W measured: I = B, W = 0
      i = std::max(0.0, b);
      w = 0;
    }
    if (b < 0) b = i + std::max(0.0, w);
    c.forward.push_back(f);
    c.backward_input.push_back(i);
    c.backward_weight.push_back(std::max(0.0, w));
    c.backward.push_back(b);
  }
  return c;
}

std::vector<double> PipelineParallel::measured_bubble() {
  Impl& I = *impl_;
  std::vector<double> mine(2 * I.comm->size(), 0.0);
  mine[2 * I.rank] = I.last_busy;
  mine[2 * I.rank + 1] = I.last_span;
  const auto all = allreduce_doubles(*I.comm, mine);
  std::vector<double> out(I.comm->size());
  for (int r = 0; r < I.comm->size(); ++r) {
    out[r] = all[2 * r + 1] > 0 ? 1.0 - all[2 * r] / all[2 * r + 1] : 0.0;
  }
  return out;
}

std::vector<pipeline::TimedAction> PipelineParallel::gather_timeline() {
  Impl& I = *impl_;
  const auto counts = allgather_longs(*I.comm, {static_cast<int64_t>(I.timeline.size())});
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  auto mine = at::zeros({most * 5}, at::kDouble);
  double* p = mine.data_ptr<double>();
  for (size_t j = 0; j < I.timeline.size(); ++j) {
    const auto& t = I.timeline[j];
    p[5 * j] = static_cast<double>(t.action.op);
    p[5 * j + 1] = t.action.stage;
    p[5 * j + 2] = t.action.microbatch;
    // On the shared steady clock (one host: one clock), so ranks line up.
    p[5 * j + 3] = I.step_start_abs + t.start;
    p[5 * j + 4] = I.step_start_abs + t.end;
  }
  auto all = at::empty({most * 5 * I.comm->size()}, at::kDouble);
  if (most > 0) I.comm->allgather(all, mine)->wait();
  const double* q = all.data_ptr<double>();
  std::vector<pipeline::TimedAction> out;
  double origin = std::numeric_limits<double>::infinity();
  for (int r = 0; r < I.comm->size(); ++r) {
    for (int64_t j = 0; j < counts[r]; ++j) origin = std::min(origin, q[(r * most + j) * 5 + 3]);
  }
  for (int r = 0; r < I.comm->size(); ++r) {
    for (int64_t j = 0; j < counts[r]; ++j) {
      const double* e = q + (r * most + j) * 5;
      out.push_back({r,
                     Action{static_cast<Op>(static_cast<int>(e[0])), static_cast<int>(e[1]),
                            static_cast<int>(e[2])},
                     e[3] - origin, e[4] - origin});
    }
  }
  return out;
}

std::vector<int64_t> PipelineParallel::suggest_balance() {
  Impl& I = *impl_;
  // Per layer: forward seconds and forward count; per stage: F and backward (B or I + W) sums.
  std::vector<double> mine(static_cast<size_t>(I.num_layers) * 2 + static_cast<size_t>(I.S) * 2,
                           0.0);
  for (const auto& [s, st] : I.stages) {
    for (size_t l = 0; l < st.layers.size(); ++l) {
      mine[2 * st.layers[l].global_index] = st.layer_forward[l];
      mine[2 * st.layers[l].global_index + 1] = static_cast<double>(st.count[0]);
    }
    mine[2 * I.num_layers + 2 * s] = st.sum[0];
    mine[2 * I.num_layers + 2 * s + 1] = st.sum[1] + st.sum[2] + st.sum[3];
  }
  const auto all = allreduce_doubles(*I.comm, mine);
  std::vector<double> weights(I.num_layers, 0.0);
  int64_t first = 0;
  for (int s = 0; s < I.S; ++s) {
    const double f = all[2 * I.num_layers + 2 * s], b = all[2 * I.num_layers + 2 * s + 1];
    const double ratio = f > 0 ? b / f : 2.0;
    for (int64_t l = first; l < first + I.balance[s]; ++l) {
      const double n = all[2 * l + 1];
      if (n <= 0) throw ConfigError("suggest_balance: run at least one train_step first");
      weights[l] = all[2 * l] / n * (1.0 + ratio);
    }
    first += I.balance[s];
  }
  return partition_balanced(weights, I.S);
}

void PipelineParallel::reset_stats() {
  for (auto& [s, st] : impl_->stages) {
    std::fill(std::begin(st.sum), std::end(st.sum), 0.0);
    std::fill(std::begin(st.count), std::end(st.count), 0);
    std::fill(st.layer_forward.begin(), st.layer_forward.end(), 0.0);
  }
}

}  // namespace tandem
