// Reducer (include/tandem/runtime/reducer.h): construction with a grad-ready hook per parameter,
// the calls around forward and backward, and the bucket plan. The buckets and their launch are in
// reducer_state.cpp, unused parameters in unused_parameters.cpp, planning in bucket_plan.cpp.
#include "runtime/ddp/reducer_state.h"

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/variable.h>

#include <ATen/ops/empty.h>

#include <algorithm>

namespace tandem {

using detail::BackwardPass;
using detail::ReducerState;

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<Communicator> comm,
                 const DistributedDataParallelOptions& options,
                 std::vector<at::Tensor> grad_targets)
    : state_(std::make_shared<detail::ReducerState>()) {
  if (params.size() != names.size()) {
    throw ConfigError("tandem: Reducer: " + std::to_string(params.size()) + " parameters but " +
                      std::to_string(names.size()) + " names.");
  }
  if (!comm) throw ConfigError("tandem: Reducer: communicator is null.");
  auto& s = *state_;
  s.caps = bucket_caps(options, "DistributedDataParallel");
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || !params[i].requires_grad() || !params[i].is_leaf()) {
      throw ConfigError("tandem: Reducer: parameter '" + names[i] +
                        "' must be a defined leaf tensor that requires grad.");
    }
  }
  if (!grad_targets.empty() && grad_targets.size() != params.size()) {
    throw ConfigError("tandem: Reducer: " + std::to_string(grad_targets.size()) +
                      " gradient targets for " + std::to_string(params.size()) + " parameters.");
  }
  for (size_t i = 0; i < grad_targets.size(); ++i) {
    if (grad_targets[i].numel() != params[i].numel()) {
      throw ConfigError("tandem: Reducer: the gradient target of parameter '" + names[i] +
                        "' has " + std::to_string(grad_targets[i].numel()) + " elements, the parameter " +
                        std::to_string(params[i].numel()) + ".");
    }
  }
  s.targets = grad_targets.empty() ? params : std::move(grad_targets);
  s.params = std::move(params);
  s.names = std::move(names);
  s.comm = std::move(comm);
  s.options = options;
  const c10::Device device = s.params.empty() ? c10::Device(c10::kCPU) : s.params[0].device();
  s.overlap = overlap_pays(options.overlap, *s.comm, device);
  if (options.mixed_precision.enabled()) s.reduce_dtype = options.mixed_precision.reduce_dtype();
  s.codec = options.codec ? options.codec : make_average_codec();
  s.locally_used.assign(s.params.size(), 0);
  s.accumulators = detail::GradAccumulators(s.params, state_);
  s.build(s.plan_for(reverse_registration_order(static_cast<int64_t>(s.params.size()))));
  s.reset_iteration();
}

Reducer::~Reducer() = default;

void Reducer::prepare_for_forward() {
  auto& s = *state_;
  std::vector<WorkPtr> stale;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.backward.begin_forward() == BackwardPass::Mode::kSynchronizing) {
      // The forward was not followed by backward (evaluation, a skipped step): drop what was
      // launched for unused parameters, on every rank alike.
      for (auto& b : s.buckets) {
        if (b.work) stale.push_back(b.work);
      }
      if (s.used_work) stale.push_back(s.used_work);
    }
  }
  for (auto& w : stale) w->wait();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.reset_iteration();
  if (!s.rebuilt && !s.rebuild_order.empty()) {
    // Rank 0's observed order wins, so every rank builds the same plan.
    at::Tensor order = at::empty({static_cast<int64_t>(s.rebuild_order.size())}, at::kLong);
    std::copy(s.rebuild_order.begin(), s.rebuild_order.end(), order.data_ptr<int64_t>());
    s.comm->broadcast(order, 0)->wait();
    std::vector<int64_t> agreed(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + order.numel());
    s.build(s.plan_for(agreed));
    s.rebuilt = true;
    s.reset_iteration();
  }
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.reset_iteration();
  s.backward.arm(true);
  if (s.options.find_unused_parameters) s.find_unused(outputs);
}

void Reducer::shadow_backward() {
  auto& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.reset_iteration();
    s.backward.arm(true);
    if (s.options.find_unused_parameters) s.find_unused({});  // used nowhere here
    s.deferred_unused.clear();
    s.backward.start_without_callback();
    for (size_t p = 0; p < s.params.size(); ++p) {
      s.view(static_cast<int64_t>(p)).zero_();
      s.mark_ready(static_cast<int64_t>(p));
    }
  }
  s.finalize();
}

void Reducer::prepare_for_accumulation() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->backward.arm(false);
}

std::vector<std::vector<int64_t>> Reducer::bucket_plan() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::vector<int64_t>> plan;
  for (const auto& b : state_->buckets) plan.push_back(b.grads.param_indices);
  return plan;
}

void Reducer::load_bucket_plan(const std::vector<std::vector<int64_t>>& plan) {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.backward.mode() == BackwardPass::Mode::kSynchronizing) {
    throw Error("tandem: Reducer::load_bucket_plan() called during a synchronised backward; load "
                "the plan between steps.");
  }
  std::vector<at::ScalarType> dtypes;
  for (const auto& p : s.params) dtypes.push_back(p.scalar_type());
  check_bucket_plan(plan, dtypes, s.names);
  s.build(plan);
  s.rebuilt = true;
  s.reset_iteration();
}

bool Reducer::buckets_rebuilt() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->rebuilt;
}

int64_t Reducer::steps() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->step;
}

const std::vector<std::string>& Reducer::parameter_names() const { return state_->names; }
GradCodec& Reducer::codec() { return *state_->codec; }
const GradCodec& Reducer::codec() const { return *state_->codec; }

double Reducer::last_overlap_seconds() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->overlap_seconds;
}

double Reducer::last_wait_seconds() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->wait_seconds;
}

}  // namespace tandem
