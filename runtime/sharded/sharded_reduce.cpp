// ShardedDataParallel, backward side: gradient hooks, reduce-scatters in reduce order while
// backward runs, and the end-of-backward callback that completes what the graph did not reach.
#include "runtime/sharded/sharded_state.h"

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/checkpoint/checkpoint_manager.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ops/empty.h>

#include <algorithm>

namespace tandem {

using State = ShardedDataParallelCore::State;

void State::arm_backward(const std::vector<at::Tensor>& outputs) {
  backward.arm(sync);
  arrived.assign(params.size(), 0);
  for (auto& u : units) {
    u.pending = static_cast<int64_t>(u.params.size());
    u.ready = false;
    u.pre_backward_ran = false;
  }
  reduce_order.clear();
  backward_gathers.clear();
  if (shards.parameters) {
    for (auto it = forward_order.rbegin(); it != forward_order.rend(); ++it) {
      reduce_order.push_back(*it);
      if (!units[*it].materialized || units[*it].gather_work) backward_gathers.push_back(*it);
    }
    // Units that did not run forward on this step still reduce (their gradients are zeros).
    for (size_t u = 0; u < units.size(); ++u) {
      if (static_cast<int>(u) != root && !units[u].forward_ran) reduce_order.push_back(static_cast<int>(u));
    }
    if (root >= 0) reduce_order.push_back(root);
  } else {
    for (size_t u = 0; u < units.size(); ++u) reduce_order.push_back(static_cast<int>(u));
  }
  reduce_next = 0;
  reduce_finished = 0;
  backward_gathered = 0;
  if (ddp.find_unused_parameters) {
    // Parameters this forward cannot reach will get no gradient: count them as arrived now, so
    // their unit is reduced as soon as the rest of it is.
    const std::vector<char> reached = accumulators.reachable(outputs);
    for (size_t p = 0; p < params.size(); ++p) {
      if (reached[p]) continue;
      arrived[p] = 1;
      if (--units[unit_of[p]].pending == 0) units[unit_of[p]].ready = true;
    }
  }
}

void State::on_grad_ready(int64_t p) {
  std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<State> weak = weak_from_this();
  if (!backward.on_gradient(names[p], arrived[p] != 0, [weak] {
        if (auto self = weak.lock()) self->finalize();
      })) {
    return;  // a backward ShardedDataParallel did not arm
  }
  arrived[p] = 1;
  const int u = unit_of[p];
  if (--units[u].pending == 0) mark_ready(u);
}

void State::mark_ready(int u) {
  units[u].ready = true;
  // Stage 3: every gradient of the unit is in, so nothing needs its parameters any more; the
  // next unit's gather takes their place ("post").
  if (u != root) release(u);
  if (prefetch_in_backward("post")) gather_for_backward(backward_gathered + 1, -1);
  if (backward.mode() == detail::BackwardPass::Mode::kSynchronizing) advance_reduces();
}

void State::advance_reduces() {
  while (reduce_next < reduce_order.size() && units[reduce_order[reduce_next]].ready) {
    reduce(reduce_order[reduce_next++]);
  }
}

at::Tensor State::reduce_output(detail::FlatUnit& unit) {
  const int64_t S = unit.shard_numel;
  if (!shards.gradients && unit.grad_options.dtype() == unit.master_options.dtype()) {
    return unit.grad_flat.narrow(0, shard_rank() * S, S);
  }
  if (!unit.grad_shard.defined()) unit.grad_shard = at::empty({S}, unit.master_options);
  return unit.grad_shard;
}

void State::reduce(int u) {
  detail::FlatUnit& unit = units[u];
  if (reduce_next == 1) first_reduce = std::chrono::steady_clock::now();
  if (u == root) release(u);
  if (unit.numel == 0) return;
  const int n = shard_size();
  const int64_t S = unit.shard_numel;
  if (shards.gradients) {
    // One bucket's full gradients in flight while the next bucket's are computed, rather than
    // every bucket's until the end of backward: the earlier reduce-scatters (in reduce order, as
    // every rank does) had this bucket's backward to run, and finishing them before this
    // bucket's buffer exists keeps two buckets, not three, at this point.
    while (reduce_finished + 1 < reduce_next) finish_reduce(reduce_order[reduce_finished++]);
    // The full gradients exist only until this reduce-scatter is done.
    unit.grad_flat = at::empty({unit.padded_numel(n)}, unit.grad_options);
    unit.zero_padding(unit.grad_flat, params);
    for (size_t k = 0; k < unit.params.size(); ++k) {
      at::Tensor& grad = params[unit.params[k]].mutable_grad();
      at::Tensor slot = unit.grad_flat.narrow(0, unit.offsets[k], params[unit.params[k]].numel());
      if (grad.defined()) {
        slot.copy_(grad.reshape({-1}));
        grad.reset();
      } else {
        slot.zero_();
      }
    }
  } else {
    // Stage 1: the parameters' .grad are views of grad_flat (set at construction); one whose
    // .grad was replaced (e.g. assigned by the user) is copied in.
    for (size_t k = 0; k < unit.params.size(); ++k) {
      const at::Tensor& p = params[unit.params[k]];
      at::Tensor slot = unit.grad_flat.narrow(0, unit.offsets[k], p.numel());
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        slot.zero_();
      } else if (!grad.is_alias_of(slot)) {
        slot.copy_(grad.reshape({-1}));
        // Mixed precision: the next backward starts from no low-precision gradient.
        if (mixed.enabled()) params[unit.params[k]].mutable_grad().reset();
      }
    }
  }
  at::Tensor output = reduce_output(unit);
  unit.reduce_begin_us = trace::enabled() ? trace::now_us() : 0;
  const bool cast = wire_dtype != unit.grad_options.dtype().toScalarType() ||
                    output.scalar_type() != wire_dtype;
  if (n == 1) {
    // Nothing sharded (stage 0): the unit is this rank's whole shard, and the replicas average it
    // with one all-reduce, as DistributedDataParallel's buckets.
    const int replicas = replicate_comm ? replicate_comm->size() : 1;
    at::Tensor in = cast ? (unit.grad_flat / static_cast<double>(replicas)).to(wire_dtype)
                         : unit.grad_flat;
    if (replicate_comm) {
      unit.reduce_work = replicate_comm->allreduce(in, cast ? ReduceOp::kSum : ReduceOp::kAvg);
    }
    unit.reduce_pending = true;
    if (!in.is_alias_of(output)) unit.grad_wire = in;  // finish_reduce copies it into `output`
    return;
  }
  if (!cast) {
    unit.reduce_work = reduce_comm->reduce_scatter(output, unit.grad_flat, ReduceOp::kAvg);
  } else {
    // Low precision on the wire: divided first (no overflow), summed in wire_dtype, cast back.
    unit.grad_wire = (unit.grad_flat / static_cast<double>(n)).to(wire_dtype);
    at::Tensor out_wire = at::empty({S}, unit.grad_wire.options());
    unit.reduce_work = reduce_comm->reduce_scatter(out_wire, unit.grad_wire, ReduceOp::kSum);
    unit.grad_wire = out_wire;  // finish_reduce casts it into `output`
  }
  unit.reduce_pending = true;
}

void State::finish_reduce(int u) {
  detail::FlatUnit& unit = units[u];
  if (unit.numel == 0 || !unit.reduce_pending) return;
  unit.reduce_pending = false;
  if (unit.reduce_work) unit.reduce_work->wait();
  unit.reduce_work.reset();
  at::Tensor output = reduce_output(unit);
  if (unit.grad_wire.defined()) {
    output.copy_(unit.grad_wire);
    unit.grad_wire = at::Tensor();
  }
  if (unit.reduce_begin_us != 0) {
    trace::async_span("unit " + unit.name + " reduce-scatter", trace::kComm,
                      static_cast<uint64_t>(step) * 8192 + static_cast<uint64_t>(u) * 2 + 1,
                      unit.reduce_begin_us, trace::now_us(),
                      trace::Args()
                          .add("unit", unit.name)
                          .add("bytes", unit.padded_numel(shard_size()) *
                                            static_cast<int64_t>(unit.grad_flat.element_size()))
                          .add("step", step));
  }
  if (shards.gradients) unit.grad_flat = at::Tensor();
  // Hybrid sharding: shards of the same index on the other groups hold the other replicas'
  // averages; averaging them gives the average over every rank (stage 0 did so already).
  if (replicate_comm && shard_size() > 1) replicate_comm->allreduce(output, ReduceOp::kAvg)->wait();
  at::Tensor& grad = unit.shard.mutable_grad();
  if (!grad.defined() || !grad.is_alias_of(output)) grad = output.detach();
}

void State::finalize() {
  std::vector<int> order;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!backward.armed()) return;
    // What this rank's graph did not reach completes now, in the same order as on every rank.
    gather_for_backward(backward_gathers.size(), -1);
    for (int u : backward_gathers) {
      wait_gathered(u);
      if (!units[u].ready) release(u);
    }
    for (auto& u : units) u.ready = true;
    for (size_t u = 0; u < units.size(); ++u) {
      if (static_cast<int>(u) != root) release(static_cast<int>(u));
    }
    if (backward.mode() == detail::BackwardPass::Mode::kAccumulating) {
      if (root >= 0) release(root);
      backward.finish();
      last_forward_order = forward_order;
      return;
    }
    advance_reduces();
    order = reduce_order;
  }
  const auto wait_start = std::chrono::steady_clock::now();
  for (int u : order) finish_reduce(u);
  std::lock_guard<std::mutex> lock(mutex);
  overlap_seconds = std::chrono::duration<double>(wait_start - first_reduce).count();
  reduce_wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  last_forward_order = forward_order;
  // The optimizer step comes next: an async checkpoint save must have copied the shards.
  wait_for_checkpoint_staging();
  // The optimizer steps the shards next, and not every optimizer bumps their version counter
  // (libtorch's SGD updates p.data()): every unit is gathered again, whoever asks first.
  for (auto& u : units) u.stale = true;
  ++step;
  backward.finish();
}

}  // namespace tandem
