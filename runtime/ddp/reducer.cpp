#include <tandem/runtime/reducer.h>

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include "collectives/async_work.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace tandem {

using Clock = std::chrono::steady_clock;

std::vector<std::vector<int64_t>> plan_buckets(const std::vector<int64_t>& order,
                                               const std::vector<at::ScalarType>& dtypes,
                                               const std::vector<int64_t>& bytes,
                                               int64_t first_cap_bytes, int64_t cap_bytes) {
  struct Open {
    std::vector<int64_t> params;
    int64_t bytes = 0;
    bool first = true;
  };
  std::map<at::ScalarType, Open> open;
  std::vector<std::vector<int64_t>> closed;
  for (int64_t p : order) {
    Open& b = open[dtypes.at(p)];
    b.params.push_back(p);
    b.bytes += bytes.at(p);
    if (b.bytes >= (b.first ? first_cap_bytes : cap_bytes)) {
      closed.push_back(std::move(b.params));
      b.params.clear();
      b.bytes = 0;
      b.first = false;
    }
  }
  for (auto& [dtype, b] : open) {
    if (!b.params.empty()) closed.push_back(std::move(b.params));
  }
  // Launch order follows the gradient order: sort by the position of each bucket's first param.
  std::vector<int64_t> position(order.size() ? *std::max_element(order.begin(), order.end()) + 1
                                             : 0);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int64_t>(i);
  std::stable_sort(closed.begin(), closed.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return closed;
}

struct ReducerState : std::enable_shared_from_this<ReducerState> {
  // kFinalized: a synchronised backward finished and no forward has started since.
  enum class Mode { kIdle, kAccumulating, kSynchronizing, kFinalized, kUnfinished };

  struct Bucket {
    GradBucket grads;
    int64_t pending = 0;
    WorkPtr work;
    int64_t launch_us = 0;  // trace: when the reduce was launched (0: not traced)
  };

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::shared_ptr<Communicator> comm;
  ReducerOptions options;
  std::shared_ptr<GradCodec> codec;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive: they own our hooks
  std::unordered_map<const torch::autograd::Node*, int64_t> accumulator_index;

  mutable std::mutex mutex;
  std::vector<Bucket> buckets;
  std::vector<std::pair<int64_t, int64_t>> location;  // param -> (bucket, slot)
  Mode mode = Mode::kIdle;
  std::vector<char> ready;
  std::vector<char> locally_used;     // since the last synchronised backward (no_sync included)
  int64_t next_launch = 0;
  bool callback_queued = false;
  std::vector<int64_t> deferred_unused;  // unreached by this forward; marked ready at first hook
  at::Tensor used_map;
  WorkPtr used_work;
  std::vector<int64_t> ready_order;   // hook order of the first synchronised backward
  std::vector<int64_t> rebuild_order; // set after the first synchronised backward
  bool rebuilt = false;
  int64_t step = 0;
  std::string unfinished;
  Clock::time_point first_launch;
  double overlap_seconds = 0;
  double wait_seconds = 0;
  int64_t backward_begin_us = 0;  // trace: first grad hook of this backward (0: not traced)

  at::Tensor view(int64_t param) const {
    const auto [b, slot] = location[param];
    const GradBucket& g = buckets[b].grads;
    // detach(): a plain tensor over the bucket's memory, not an autograd view, so optimizers may
    // detach_()/zero_() it when it becomes `.grad` (gradient_as_bucket_view).
    return g.buffer.narrow(0, g.offsets[slot], params[param].numel())
        .view(params[param].sizes())
        .detach();
  }

  void build(const std::vector<std::vector<int64_t>>& plan) {
    buckets.clear();
    location.assign(params.size(), {-1, -1});
    for (size_t b = 0; b < plan.size(); ++b) {
      Bucket bucket;
      bucket.grads.index = static_cast<int64_t>(b);
      int64_t total = 0;
      for (int64_t p : plan[b]) {
        bucket.grads.param_indices.push_back(p);
        bucket.grads.offsets.push_back(total);
        bucket.grads.shapes.push_back(params[p].sizes().vec());
        location[p] = {static_cast<int64_t>(b), static_cast<int64_t>(bucket.grads.offsets.size() - 1)};
        total += params[p].numel();
      }
      bucket.grads.buffer = at::zeros({total}, params[plan[b].front()].options().requires_grad(false));
      buckets.push_back(std::move(bucket));
    }
    if (options.gradient_as_bucket_view) {
      for (size_t p = 0; p < params.size(); ++p) {
        at::Tensor& grad = params[p].mutable_grad();
        at::Tensor v = view(static_cast<int64_t>(p));
        if (grad.defined()) {
          v.copy_(grad);
          grad = v;
        }
      }
    }
  }

  std::vector<std::vector<int64_t>> plan_for(const std::vector<int64_t>& order) const {
    std::vector<at::ScalarType> dtypes;
    std::vector<int64_t> bytes;
    for (const auto& p : params) {
      dtypes.push_back(p.scalar_type());
      bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
    }
    return plan_buckets(order, dtypes, bytes,
                        static_cast<int64_t>(options.first_bucket_cap_mb * 1024 * 1024),
                        static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024));
  }

  // The bucket slot takes the parameter's current gradient (zeros when it has none).
  void copy_into_bucket(int64_t p) {
    at::Tensor v = view(p);
    at::Tensor& grad = params[p].mutable_grad();
    if (!grad.defined()) {
      v.zero_();
    } else if (options.gradient_as_bucket_view) {
      if (!grad.is_alias_of(v)) {
        v.copy_(grad);
        grad = v;
      }
    } else {
      v.copy_(grad);
    }
  }

  void mark_ready(int64_t p) {
    ready[p] = 1;
    Bucket& b = buckets[location[p].first];
    if (--b.pending > 0) return;
    while (next_launch < static_cast<int64_t>(buckets.size()) && buckets[next_launch].pending == 0) {
      Bucket& next = buckets[next_launch++];
      if (next_launch == 1) first_launch = Clock::now();
      next.grads.step = step;
      next.launch_us = trace::enabled() ? trace::now_us() : 0;
      next.work = codec->reduce(*comm, next.grads);
    }
  }

  void reset_iteration() {
    ready.assign(params.size(), 0);
    for (auto& b : buckets) {
      b.pending = static_cast<int64_t>(b.grads.param_indices.size());
      b.work.reset();
    }
    next_launch = 0;
    callback_queued = false;
    deferred_unused.clear();
    used_work.reset();
  }

  std::vector<char> reachable(const std::vector<at::Tensor>& outputs) const {
    std::vector<char> reached(params.size(), 0);
    std::vector<torch::autograd::Node*> stack;
    std::unordered_set<torch::autograd::Node*> seen;
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      if (auto fn = out.grad_fn()) {
        stack.push_back(fn.get());
      } else if (auto acc = torch::autograd::impl::try_get_grad_accumulator(out)) {
        stack.push_back(acc.get());
      }
    }
    while (!stack.empty()) {
      torch::autograd::Node* node = stack.back();
      stack.pop_back();
      if (!seen.insert(node).second) continue;
      auto it = accumulator_index.find(node);
      if (it != accumulator_index.end()) reached[it->second] = 1;
      for (const auto& edge : node->next_edges()) {
        if (edge.function) stack.push_back(edge.function.get());
      }
    }
    return reached;
  }

  void on_grad_ready(int64_t p) {
    std::lock_guard<std::mutex> lock(mutex);
    if (mode == Mode::kAccumulating) {
      locally_used[p] = 1;
      return;
    }
    if (mode == Mode::kFinalized) {
      throw Error("tandem: DistributedDataParallel: parameter '" + names[p] +
                  "' received a gradient after the synchronised backward of its forward had "
                  "finished: backward ran twice through one forward (retain_graph). Its "
                  "gradient would not be averaged; run one backward per forward.");
    }
    if (mode != Mode::kSynchronizing) return;  // a backward DistributedDataParallel did not arm
    if (ready[p]) {
      throw Error("tandem: DistributedDataParallel: parameter '" + names[p] +
                  "' received its gradient twice in one synchronised backward (backward run "
                  "twice through one forward, or a reentrant use of the parameter). Run one "
                  "backward per forward, or accumulate under no_sync().");
    }
    locally_used[p] = 1;
    if (!callback_queued) {
      callback_queued = true;
      backward_begin_us = trace::enabled() ? trace::now_us() : 0;
      std::weak_ptr<ReducerState> weak = weak_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto self = weak.lock()) self->finalize();
      });
    }
    if (!rebuilt && step == 0) ready_order.push_back(p);
    if (!deferred_unused.empty()) {
      // Backward really runs: now the parameters this forward did not reach join their buckets.
      for (int64_t unused : deferred_unused) {
        copy_into_bucket(unused);
        mark_ready(unused);
      }
      deferred_unused.clear();
    }
    copy_into_bucket(p);
    mark_ready(p);
  }

  // Timeline: backward compute (first hook -> all buckets launched), the wait for the reduces,
  // and each bucket's reduce from launch to completion as an async span.
  void trace_backward(Clock::time_point wait_start, Clock::time_point done) {
    if (backward_begin_us != 0) {
      trace::complete("backward", trace::kCompute, backward_begin_us, trace::to_us(wait_start),
                      trace::Args().add("step", step));
    }
    trace::complete("reduce wait", trace::kWait, trace::to_us(wait_start), trace::to_us(done));
    const std::string codec_name = codec->name();
    for (const auto& b : buckets) {
      if (b.launch_us == 0) continue;
      auto* async = dynamic_cast<AsyncWork*>(b.work.get());
      const int64_t end = async != nullptr ? trace::to_us(async->finished_at()) : trace::to_us(done);
      const int64_t bytes = b.grads.buffer.numel() * static_cast<int64_t>(b.grads.buffer.element_size());
      trace::async_span("bucket " + std::to_string(b.grads.index) + " reduce", trace::kComm,
                        static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(b.grads.index),
                        b.launch_us, end,
                        trace::Args().add("bucket", b.grads.index).add("bytes", bytes)
                            .add("codec", codec_name).add("step", step));
    }
  }

  void finalize() {
    std::vector<WorkPtr> works;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (mode != Mode::kSynchronizing) return;
      if (next_launch < static_cast<int64_t>(buckets.size())) {
        std::string bucket_list, param_list;
        int listed = 0;
        for (size_t b = next_launch; b < buckets.size(); ++b) {
          if (buckets[b].pending == 0) continue;
          bucket_list += (bucket_list.empty() ? "" : ", ") + std::to_string(b);
          for (int64_t p : buckets[b].grads.param_indices) {
            if (ready[p]) continue;
            if (listed++ < 20) param_list += (param_list.empty() ? "" : ", ") + names[p];
          }
        }
        if (listed > 20) param_list += " (+" + std::to_string(listed - 20) + " more)";
        unfinished =
            "tandem: DistributedDataParallel: forward called before the previous iteration's "
            "gradient reduction finished: bucket(s) " +
            bucket_list +
            " never became ready; parameters that received no gradient: " + param_list +
            ". Some parameters did not take part in computing the loss. Construct "
            "DistributedDataParallel with find_unused_parameters = true, or make every parameter "
            "contribute to the loss on every rank.";
        mode = Mode::kUnfinished;
        return;
      }
      for (auto& b : buckets) works.push_back(b.work);
      if (used_work) works.push_back(used_work);
    }
    const auto wait_start = Clock::now();
    for (auto& w : works) w->wait();
    const auto done = Clock::now();
    std::lock_guard<std::mutex> lock(mutex);
    if (trace::enabled()) trace_backward(wait_start, done);
    overlap_seconds = std::chrono::duration<double>(wait_start - first_launch).count();
    wait_seconds = std::chrono::duration<double>(done - wait_start).count();
    const int32_t* used = used_map.defined() ? used_map.data_ptr<int32_t>() : nullptr;
    for (size_t p = 0; p < params.size(); ++p) {
      if (used != nullptr && used[p] == 0) continue;  // unused on every rank: .grad untouched
      at::Tensor v = view(static_cast<int64_t>(p));
      at::Tensor& grad = params[p].mutable_grad();
      if (options.gradient_as_bucket_view) {
        if (!grad.defined() || !grad.is_alias_of(v)) grad = v;
      } else if (grad.defined()) {
        grad.copy_(v);
      } else {
        grad = v.clone();
      }
    }
    std::fill(locally_used.begin(), locally_used.end(), 0);
    if (step == 0 && !rebuilt) {
      rebuild_order = ready_order;
      std::vector<char> listed(params.size(), 0);
      for (int64_t p : ready_order) listed[p] = 1;
      for (int64_t p = static_cast<int64_t>(params.size()) - 1; p >= 0; --p) {
        if (!listed[p]) rebuild_order.push_back(p);
      }
    }
    ++step;
    mode = Mode::kFinalized;
  }
};

namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<ReducerState> state, int64_t index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto state = state_.lock()) state->on_grad_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<ReducerState> state_;
  int64_t index_;
};

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<Communicator> comm, ReducerOptions options,
                 std::shared_ptr<GradCodec> codec)
    : state_(std::make_shared<ReducerState>()) {
  if (params.size() != names.size()) {
    throw ConfigError("tandem: Reducer: " + std::to_string(params.size()) + " parameters but " +
                      std::to_string(names.size()) + " names.");
  }
  if (!comm) throw ConfigError("tandem: Reducer: communicator is null.");
  if (!(options.bucket_cap_mb > 0) || !(options.first_bucket_cap_mb > 0)) {
    throw ConfigError("tandem: Reducer: bucket_cap_mb (" + std::to_string(options.bucket_cap_mb) +
                      ") and first_bucket_cap_mb (" + std::to_string(options.first_bucket_cap_mb) +
                      ") must be positive.");
  }
  auto& s = *state_;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || !params[i].requires_grad() || !params[i].is_leaf()) {
      throw ConfigError("tandem: Reducer: parameter '" + names[i] +
                        "' must be a defined leaf tensor that requires grad.");
    }
  }
  s.params = std::move(params);
  s.names = std::move(names);
  s.comm = std::move(comm);
  s.options = options;
  s.codec = codec ? std::move(codec) : make_average_codec();
  s.locally_used.assign(s.params.size(), 0);
  for (size_t i = 0; i < s.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(s.params[i]);
    acc->add_post_hook(std::make_unique<ReadyHook>(state_, static_cast<int64_t>(i)));
    s.accumulator_index[acc.get()] = static_cast<int64_t>(i);
    s.accumulators.push_back(std::move(acc));
  }
  std::vector<int64_t> order(s.params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
  s.build(s.plan_for(order));
  s.reset_iteration();
}

Reducer::~Reducer() = default;

void Reducer::prepare_for_forward() {
  auto& s = *state_;
  std::vector<WorkPtr> stale;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.mode == ReducerState::Mode::kUnfinished ||
        (s.mode == ReducerState::Mode::kSynchronizing && s.callback_queued)) {
      std::string msg =
          s.unfinished.empty()
              ? "tandem: DistributedDataParallel: forward called while the previous backward "
                "had not finished (it raised, or its graph was dropped midway)."
              : s.unfinished;
      s.mode = ReducerState::Mode::kIdle;
      s.unfinished.clear();
      throw Error(msg);
    }
    if (s.mode == ReducerState::Mode::kSynchronizing) {
      // The forward was not followed by backward (evaluation, a skipped step): drop what was
      // launched for unused parameters, on every rank alike.
      for (auto& b : s.buckets) {
        if (b.work) stale.push_back(b.work);
      }
      if (s.used_work) stale.push_back(s.used_work);
    }
    s.mode = ReducerState::Mode::kIdle;
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
  s.mode = ReducerState::Mode::kSynchronizing;
  if (!s.options.find_unused_parameters) return;
  const std::vector<char> reached = s.reachable(outputs);
  s.used_map = at::empty({static_cast<int64_t>(s.params.size())}, at::kInt);
  int32_t* used = s.used_map.data_ptr<int32_t>();
  for (size_t p = 0; p < s.params.size(); ++p) used[p] = reached[p] || s.locally_used[p];
  // First collective of the iteration on every rank, before any bucket.
  s.used_work = s.comm->allreduce(s.used_map, ReduceOp::kMax);
  // Unreached parameters contribute their current gradient (accumulated under no_sync, or zeros)
  // once backward starts. Not before: a forward without backward must launch nothing that other
  // ranks (with other unused sets) would not launch, and must not touch `.grad`.
  for (size_t p = 0; p < s.params.size(); ++p) {
    if (!reached[p]) s.deferred_unused.push_back(static_cast<int64_t>(p));
  }
}

void Reducer::prepare_for_accumulation() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->mode = ReducerState::Mode::kAccumulating;
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
  if (s.mode == ReducerState::Mode::kSynchronizing) {
    throw Error("tandem: Reducer::load_bucket_plan() called during a synchronised backward; load "
                "the plan between steps.");
  }
  const int64_t n = static_cast<int64_t>(s.params.size());
  std::vector<int> seen(s.params.size(), 0);
  for (size_t b = 0; b < plan.size(); ++b) {
    for (int64_t p : plan[b]) {
      if (p < 0 || p >= n || seen[p]++) {
        throw ConfigError("tandem: bucket plan: bucket " + std::to_string(b) + " lists parameter " +
                          std::to_string(p) + ", which is out of range (the model has " +
                          std::to_string(n) + ") or already in a bucket. The plan was saved for "
                          "another model; resume with the model it was saved with.");
      }
      if (s.params[p].scalar_type() != s.params[plan[b].front()].scalar_type()) {
        throw ConfigError("tandem: bucket plan: bucket " + std::to_string(b) +
                          " mixes dtypes (parameter '" + s.names[p] + "'); the plan was saved "
                          "for another model.");
      }
    }
    if (plan[b].empty()) throw ConfigError("tandem: bucket plan: bucket " + std::to_string(b) + " is empty.");
  }
  for (int64_t p = 0; p < n; ++p) {
    if (!seen[p]) {
      throw ConfigError("tandem: bucket plan: parameter '" + s.names[p] +
                        "' is in no bucket; the plan was saved for another model.");
    }
  }
  s.build(plan);
  s.rebuilt = true;
  s.reset_iteration();
}

bool Reducer::buckets_rebuilt() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->rebuilt;
}

const std::vector<std::string>& Reducer::parameter_names() const { return state_->names; }
GradCodec& Reducer::codec() { return *state_->codec; }

double Reducer::last_overlap_seconds() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->overlap_seconds;
}

double Reducer::last_wait_seconds() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->wait_seconds;
}

}  // namespace tandem
