// ShardedDataParallel's communicators: made at construction, replaced by reconnect() when a
// fault-tolerant group re-forms (tandem/runtime/fault_tolerance.h), and what an aborted step
// leaves behind dropped.
#include "runtime/sharded/sharded_state.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/device_mesh.h>

#include <torch/csrc/autograd/grad_mode.h>

#include <exception>

namespace tandem {

using State = ShardedDataParallelCore::State;

void State::connect(std::shared_ptr<DeviceMesh> dp_mesh) {
  mesh = std::move(dp_mesh);
  world = mesh->group({"dp_replicate", "dp_shard"});
  // Gathers and reduce-scatters on communicators of their own (see sharded_state.h): two lanes.
  shard_comm = mesh->group({"dp_shard"}, "gather");
  reduce_comm = mesh->group({"dp_shard"}, "reduce");
  replicate_comm = mesh->size("dp_replicate") > 1 ? mesh->group({"dp_replicate"}) : nullptr;
}

namespace {

ConfigError layout_changed(const State& s, const Communicator& world) {
  return ConfigError("tandem: ShardedDataParallel::reconnect: rank " + std::to_string(world.rank()) +
                     " of " + std::to_string(world.size()) + " cannot keep its shard (position " +
                     std::to_string(s.shard_rank()) + " in a shard group of " +
                     std::to_string(s.shard_size()) + "): the layout changed. Sharded state goes "
                     "on only where every shard keeps its position; otherwise restart from the "
                     "checkpoint.");
}

}  // namespace

void ShardedDataParallelCore::reconnect(std::shared_ptr<Communicator> world) {
  if (!world) throw ConfigError("tandem: ShardedDataParallel::reconnect: communicator is null.");
  if (world->size() % state_->shard_size() != 0) throw layout_changed(*state_, *world);
  reconnect(state_->mesh->rebuilt(std::move(world)));
}

void ShardedDataParallelCore::reconnect(std::shared_ptr<DeviceMesh> mesh) {
  State& s = *state_;
  if (!mesh) throw ConfigError("tandem: ShardedDataParallel::reconnect: the mesh is null.");
  if (mesh->size("dp_shard") != s.shard_size() || mesh->coordinate("dp_shard") != s.shard_rank()) {
    throw layout_changed(s, *mesh->world());
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.backward.armed()) {
      throw Error("tandem: ShardedDataParallel::reconnect: called during a backward; call it "
                  "between steps.");
    }
  }
  s.connect(std::move(mesh));
  // A replacement's constructor runs this collective too.
  s.verify_same_everywhere();
  // Every member starts over as a new wrapper does, so all issue the same collectives: the unit
  // order is checked again, stage 3 has no prefetch plan, and every unit is gathered.
  s.order_checked = false;
  s.last_forward_order.clear();
  for (auto& u : s.units) u.stale = true;
}

void State::drop_step() {
  std::lock_guard<std::mutex> lock(mutex);
  torch::autograd::AutoGradMode no_grad(false);
  for (auto& u : units) {
    // The step's communicator was aborted first, so its collectives end now; waiting for them
    // means nothing writes into these buffers later.
    for (WorkPtr* work : {&u.gather_work, &u.reduce_work}) {
      if (!*work) continue;
      try {
        (*work)->wait();
      } catch (const std::exception&) {  // the abort's CommError: the step is being dropped
      }
      work->reset();
    }
    u.gather_input = at::Tensor();
    u.grad_wire = at::Tensor();
    u.reduce_pending = false;
    u.stale = true;  // a gather may have filled part of `flat`: gather it again
    u.ready = false;
    u.forward_ran = false;
    u.pre_backward_ran = false;
    u.pending = 0;
  }
  // Gradients the backward made and did not reduce; stages 0-1 keep their .grad views of
  // grad_flat, zeroed below.
  for (size_t p = 0; p < params.size(); ++p) {
    const at::Tensor& flat = units[unit_of[p]].grad_flat;
    at::Tensor& grad = params[p].mutable_grad();
    if (grad.defined() && !(flat.defined() && grad.is_alias_of(flat))) grad.reset();
  }
  for (auto& u : units) {
    if (shards.gradients) {
      u.grad_flat = at::Tensor();  // stages 2-3: exists only while the unit is reduced
    } else if (u.grad_flat.defined()) {
      u.grad_flat.zero_();
    }
    if (u.shard.defined()) u.shard.mutable_grad().reset();  // half-reduced: the optimizer must not see it
  }
  backward.reset();
  arrived.clear();
  forward_order.clear();
  reduce_order.clear();
  reduce_next = 0;
  reduce_finished = 0;
  backward_gathers.clear();
  backward_gathered = 0;
}

}  // namespace tandem
