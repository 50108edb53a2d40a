// The Reducer's buckets and their launch as gradients arrive (runtime/ddp/reducer_state.h).
#include "runtime/ddp/reducer_state.h"


#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/checkpoint/checkpoint_manager.h>


#include <ATen/ops/zeros.h>

#include <algorithm>

namespace tandem::detail {

at::Tensor ReducerState::view(int64_t param) const {
  const auto [b, slot] = location[param];
  const GradBucket& g = buckets[b].grads;
  // detach(): a plain tensor over the bucket's memory, not an autograd view, so optimizers may
  // detach_()/zero_() it when it becomes `.grad` (gradient_as_bucket_view).
  return g.buffer.narrow(0, g.offsets[slot], params[param].numel())
      .view(params[param].sizes())
      .detach();
}

at::ScalarType ReducerState::bucket_dtype(int64_t param) const {
  return reduce_dtype == at::ScalarType::Undefined ? params[param].scalar_type() : reduce_dtype;
}

bool ReducerState::target_is_view(int64_t param) const {
  return options.gradient_as_bucket_view && targets[param].scalar_type() == bucket_dtype(param);
}

void ReducerState::build(const BucketPlan& plan) {
  buckets.clear();
  location.assign(params.size(), {-1, -1});
  for (size_t b = 0; b < plan.size(); ++b) {
    Bucket bucket;
    bucket.grads.index = static_cast<int64_t>(b);
    const int64_t first = plan[b].front();
    const at::TensorOptions options =
        params[first].options().dtype(bucket_dtype(first)).requires_grad(false);
    std::vector<int64_t> numels;
    for (int64_t p : plan[b]) {
      location[p] = {static_cast<int64_t>(b), static_cast<int64_t>(numels.size())};
      numels.push_back(params[p].numel());
      bucket.grads.param_indices.push_back(p);
      bucket.grads.shapes.push_back(params[p].sizes().vec());
    }
    int64_t total = 0;
    bucket.grads.offsets = flat_layout(numels, static_cast<int64_t>(options.dtype().itemsize()),
                                       params[first].device(), &total);
    bucket.grads.buffer = at::zeros({total}, options);  // the gaps stay zero
    buckets.push_back(std::move(bucket));
  }
  for (size_t p = 0; p < params.size(); ++p) {
    if (!target_is_view(static_cast<int64_t>(p))) continue;
    at::Tensor& grad = targets[p].mutable_grad();
    at::Tensor v = view(static_cast<int64_t>(p));
    if (grad.defined()) {
      v.copy_(grad);
      grad = v;
    }
  }
}

BucketPlan ReducerState::plan_for(const std::vector<int64_t>& order) const {
  std::vector<at::ScalarType> dtypes;
  std::vector<int64_t> bytes;
  for (size_t p = 0; p < params.size(); ++p) {
    dtypes.push_back(bucket_dtype(static_cast<int64_t>(p)));
    bytes.push_back(params[p].numel() * static_cast<int64_t>(c10::elementSize(dtypes.back())));
  }
  return plan_buckets(order, dtypes, bytes, caps.first_bytes, caps.bytes);
}

// The bucket slot takes the parameter's current gradient (zeros when it has none).
void ReducerState::copy_into_bucket(int64_t p) {
  at::Tensor v = view(p);
  at::Tensor& grad = params[p].mutable_grad();
  if (!grad.defined()) {
    v.zero_();
  } else if (!targets[p].is_same(params[p])) {
    // Mixed precision: the low-precision gradient is cast into the bucket and released, so the
    // next backward starts from none (the optimizer only clears the masters' .grad).
    v.copy_(grad);
    grad.reset();
  } else if (options.gradient_as_bucket_view) {
    if (!grad.is_alias_of(v)) {
      v.copy_(grad);
      grad = v;
    }
  } else {
    v.copy_(grad);
  }
}

void ReducerState::mark_ready(int64_t p) {
  ready[p] = 1;
  Bucket& b = buckets[location[p].first];
  if (--b.pending > 0) return;
  if (overlap) launch_ready();
}

void ReducerState::launch_ready() {
  while (next_launch < static_cast<int64_t>(buckets.size()) && buckets[next_launch].pending == 0) {
    Bucket& next = buckets[next_launch++];
    if (next_launch == 1) first_launch = ReducerClock::now();
    next.grads.step = step;
    next.launch_us = trace::enabled() ? trace::now_us() : 0;
    if (trace::nvtx()) next.nvtx = trace::nvtx_start("tandem bucket reduce");
    next.work = codec->reduce(*comm, next.grads);
  }
}

void ReducerState::reset_iteration() {
  ready.assign(params.size(), 0);
  for (auto& b : buckets) {
    b.pending = static_cast<int64_t>(b.grads.param_indices.size());
    b.work.reset();
  }
  next_launch = 0;
  deferred_unused.clear();
  used_work.reset();
}

void ReducerState::on_grad_ready(int64_t p) {
  std::lock_guard<std::mutex> lock(mutex);
  // Under no_sync() a gradient only marks its parameter used; the buckets wait for a synchronised
  // backward, so nothing needs finalizing.
  if (backward.mode() == BackwardPass::Mode::kAccumulating) {
    locally_used[p] = 1;
    return;
  }
  const bool first = !backward.started();
  std::weak_ptr<ReducerState> weak = weak_from_this();
  if (!backward.on_gradient(names[p], ready[p] != 0, [weak] {
        if (auto self = weak.lock()) self->finalize();
      })) {
    return;  // a backward DistributedDataParallel did not arm
  }
  locally_used[p] = 1;
  if (first) {
    backward_begin_us = trace::enabled() ? trace::now_us() : 0;
    if (trace::nvtx()) backward_nvtx = trace::nvtx_start("tandem backward");
  }
  if (!rebuilt && step == 0) ready_order.push_back(p);
  mark_deferred_ready();
  copy_into_bucket(p);
  mark_ready(p);
}

// Timeline: backward compute (first hook -> all buckets launched), the wait for the reduces,
// and each bucket's reduce from launch to completion as an async span.
void ReducerState::trace_backward(ReducerClock::time_point wait_start,
                                  ReducerClock::time_point done) {
  if (backward_begin_us != 0) {
    trace::complete("backward", trace::kCompute, backward_begin_us, trace::to_us(wait_start),
                    trace::Args().add("step", step));
  }
  trace::complete("reduce wait", trace::kWait, trace::to_us(wait_start), trace::to_us(done));
  const std::string codec_name = codec->name();
  for (const auto& b : buckets) {
    if (b.launch_us == 0) continue;
    const int64_t end = trace::to_us(b.work->completed_at().value_or(done));
    const int64_t bytes = b.grads.buffer.numel() * static_cast<int64_t>(b.grads.buffer.element_size());
    trace::async_span("bucket " + std::to_string(b.grads.index) + " reduce", trace::kComm,
                      static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(b.grads.index),
                      b.launch_us, end,
                      trace::Args().add("bucket", b.grads.index).add("bytes", bytes)
                          .add("codec", codec_name).add("step", step));
  }
}

void ReducerState::finalize() {
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (backward.mode() != BackwardPass::Mode::kSynchronizing) return;
    if (!overlap) launch_ready();  // every bucket now, in order, with the cores free
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
      backward.fail(
          "tandem: DistributedDataParallel: forward called before the previous iteration's "
          "gradient reduction finished: bucket(s) " +
          bucket_list +
          " never became ready; parameters that received no gradient: " + param_list +
          ". Some parameters did not take part in computing the loss. Set "
          "--set ddp.find_unused_parameters=true (DistributedDataParallelOptions::"
          "find_unused_parameters), or make every parameter contribute to the loss on every rank.");
      return;
    }
    for (auto& b : buckets) works.push_back(b.work);
    if (used_work) works.push_back(used_work);
  }
  const auto wait_start = ReducerClock::now();
  for (auto& w : works) w->wait();
  const auto done = ReducerClock::now();
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& b : buckets) {
    trace::nvtx_end(b.nvtx);
    b.nvtx = 0;
  }
  trace::nvtx_end(backward_nvtx);
  backward_nvtx = 0;
  if (trace::enabled()) trace_backward(wait_start, done);
  overlap_seconds = std::chrono::duration<double>(wait_start - first_launch).count();
  wait_seconds = std::chrono::duration<double>(done - wait_start).count();
  for (size_t p = 0; p < params.size(); ++p) {
    if (!used_anywhere(static_cast<int64_t>(p))) continue;  // no rank used it: .grad untouched
    at::Tensor v = view(static_cast<int64_t>(p));
    at::Tensor& grad = targets[p].mutable_grad();
    if (target_is_view(static_cast<int64_t>(p))) {
      if (!grad.defined() || !grad.is_alias_of(v)) grad = v;
    } else if (grad.defined()) {
      grad.copy_(v);
    } else {
      grad = v.to(targets[p].scalar_type(), /*non_blocking=*/false, /*copy=*/true);
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
  // The optimizer step comes next: an async checkpoint save must have copied the parameters.
  wait_for_checkpoint_staging();
  ++step;
  backward.finish();
}

}  // namespace tandem::detail
