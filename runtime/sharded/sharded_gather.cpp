// ShardedDataParallel, forward side: all-gathers of the shards into the flat buffers, stage 3's
// per-unit gather/free around each ShardedUnit's forward, and the pre-backward node that asks for
// a unit's parameters again before its backward.
#include "runtime/sharded/sharded_state.h"

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ops/empty.h>

#include <algorithm>

namespace tandem {

using State = ShardedDataParallelCore::State;

namespace {

// The identity on a unit's outputs whose backward runs first among the unit's: it asks for the
// unit's parameters before the unit's own backward needs them (and prefetches the next unit).
class PreBackwardNode : public torch::autograd::Node {
 public:
  PreBackwardNode(std::weak_ptr<State> state, int unit) : state_(std::move(state)), unit_(unit) {}
  std::string name() const override { return "tandem::ShardedUnitPreBackward"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (auto state = state_.lock()) state->pre_backward(unit_);
    return std::move(grads);
  }

 private:
  std::weak_ptr<State> state_;
  int unit_;
};

// A tensor over `t`'s memory with a version counter of its own (collectives write through it).
at::Tensor alias_of(const at::Tensor& t) {
  at::Tensor alias = at::empty({0}, t.options());
  alias.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
  return alias;
}

}  // namespace

bool State::resharded(int u) const {
  if (!shards.parameters || u == root) return false;
  if (!options.reshard_after_forward) return false;
  // The unit that ran last is the first to run backward: keep it (as FSDP does).
  return last_forward_order.empty() || last_forward_order.back() != u;
}

void State::gather(int u, bool prefetch) {
  detail::FlatUnit& unit = units[u];
  if (unit.gather_work || unit.numel == 0) return;
  if (!shards.parameters) {
    if (!unit.stale && unit.shard._version() == unit.gathered_version) return;  // nothing stepped
    if (shard_size() == 1) {
      // The shard is the whole unit (nothing sharded, or one rank): nothing to gather; mixed
      // precision casts the master into the model's parameters.
      if (mixed.enabled()) alias_of(unit.flat).copy_(unit.shard.detach());
      unit.gathered_version = unit.shard._version();
      unit.stale = false;
      return;
    }
  } else {
    if (unit.materialized && !unit.stale) return;
    if (!unit.materialized) detail::allocate_storage(unit, params);
    unit.materialized = true;
  }
  // Stages 1-2: the shard is a slice of the output; the collective gets a copy of it. Mixed
  // precision: the fp32 master, cast.
  if (mixed.enabled()) {
    unit.gather_input = unit.shard.detach().to(unit.options.dtype().toScalarType());
  } else {
    unit.gather_input = shards.parameters ? unit.shard.detach() : unit.shard.detach().clone();
  }
  unit.gather_prefetched = prefetch;
  unit.gather_begin_us = trace::enabled() ? trace::now_us() : 0;
  unit.gather_work = shard_comm->allgather(alias_of(unit.flat), unit.gather_input);
}

void State::wait_gathered(int u) {
  detail::FlatUnit& unit = units[u];
  if (!unit.gather_work) return;
  const auto wait_start = std::chrono::steady_clock::now();
  unit.gather_work->wait();
  gather_wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  unit.gather_work.reset();
  unit.gather_input = at::Tensor();
  unit.gathered_version = unit.shard._version();
  unit.stale = false;
  if (unit.gather_begin_us != 0) {
    trace::async_span("unit " + unit.name + " all-gather", trace::kComm,
                      static_cast<uint64_t>(step) * 8192 + static_cast<uint64_t>(u) * 2,
                      unit.gather_begin_us, trace::now_us(),
                      trace::Args()
                          .add("unit", unit.name)
                          .add("bytes", unit.padded_numel(shard_size()) *
                                            static_cast<int64_t>(unit.flat.element_size()))
                          .add("prefetch", unit.gather_prefetched ? "yes" : "no")
                          .add("step", step));
  }
}

void State::release(int u) {
  detail::FlatUnit& unit = units[u];
  if (!shards.parameters || !unit.materialized || unit.numel == 0) return;
  wait_gathered(u);  // never free memory a collective still writes into
  detail::free_storage(unit, params);
  unit.materialized = false;
}

void State::check_parameter_versions() {
  for (size_t p = 0; p < params.size(); ++p) {
    if (param_versions.empty() || params[p]._version() == param_versions[p]) continue;
    throw Error(
        "tandem: ShardedDataParallel: parameter '" + names[p] +
        "' of the model was modified in place since the last step, but its values come from the "
        "shards: an optimizer built over the model's parameters (build it over "
        "ShardedDataParallel::parameters()), or a checkpoint loaded into the module (register the "
        "model with the checkpoint manager through ShardedDataParallel). The change would be "
        "overwritten by the next all-gather.");
  }
}

void State::before_forward(int u) {
  std::lock_guard<std::mutex> lock(mutex);
  detail::FlatUnit& unit = units[u];
  const bool in_backward = backward.armed();
  if (unit.forward_ran && in_backward) {
    // Activation checkpointing recomputes the unit inside backward: its backward starts now.
    want_for_backward(u);
    return;
  }
  if (unit.forward_ran) {
    throw Error("tandem: ShardedDataParallel: unit '" + unit.name +
                "' ran its forward twice in one step. A unit is gathered and freed once per "
                "forward; call the module once per step, or leave it outside ShardedUnit (its "
                "parameters then join the root unit, gathered for the whole step).");
  }
  unit.forward_ran = true;
  forward_order.push_back(u);
  gather(u, /*prefetch=*/false);
  wait_gathered(u);
  if (!options.prefetch) return;
  // Prefetch the unit that followed this one in the previous step's forward.
  auto it = std::find(last_forward_order.begin(), last_forward_order.end(), u);
  if (it != last_forward_order.end() && it + 1 != last_forward_order.end()) {
    gather(*(it + 1), /*prefetch=*/true);
  }
}

std::vector<at::Tensor> State::after_forward(int u, std::vector<at::Tensor> outputs) {
  std::lock_guard<std::mutex> lock(mutex);
  bool any = false;
  for (const auto& o : outputs) any = any || (o.defined() && o.requires_grad());
  if (torch::autograd::GradMode::is_enabled() && any) {
    auto node = std::shared_ptr<PreBackwardNode>(new PreBackwardNode(weak_from_this(), u),
                                                 torch::autograd::deleteNode);
    torch::autograd::edge_list edges;
    for (const auto& o : outputs) {
      if (o.defined() && o.requires_grad()) edges.push_back(torch::autograd::impl::gradient_edge(o));
    }
    node->set_next_edges(std::move(edges));
    for (auto& o : outputs) {
      if (!o.defined() || !o.requires_grad()) continue;
      o = o.detach();
      torch::autograd::set_history(o, node);
    }
  }
  const bool in_backward = backward.armed();
  if (!in_backward && resharded(u)) release(u);
  return outputs;
}

bool State::prefetch_in_backward(const char* when) const {
  return shards.parameters && options.prefetch && options.backward_prefetch == when;
}

void State::gather_for_backward(size_t upto, int current) {
  upto = std::min(upto, backward_gathers.size());
  for (; backward_gathered < upto; ++backward_gathered) {
    const int v = backward_gathers[backward_gathered];
    gather(v, /*prefetch=*/v != current);
  }
}

void State::pre_backward(int u) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!backward.armed()) return;
  want_for_backward(u);
}

void State::want_for_backward(int u) {
  detail::FlatUnit& unit = units[u];
  if (unit.pre_backward_ran) {
    wait_gathered(u);
    return;
  }
  unit.pre_backward_ran = true;
  // Gathers run in backward order: this unit's, every one before it, and (prefetch "pre") the
  // next; with "post" the next is prefetched once this unit's gradients are in (mark_ready).
  const auto rank_of = [&](int v) {
    return std::find(reduce_order.begin(), reduce_order.end(), v) - reduce_order.begin();
  };
  const auto mine = rank_of(u);
  size_t upto = backward_gathered;
  while (upto < backward_gathers.size() && rank_of(backward_gathers[upto]) <= mine) ++upto;
  if (prefetch_in_backward("pre") && upto < backward_gathers.size()) ++upto;
  gather_for_backward(upto, u);
  wait_gathered(u);
}

}  // namespace tandem
