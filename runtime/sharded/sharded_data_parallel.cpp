// ShardedDataParallelCore: construction, the forward wrappers, and what a training loop asks of
// it between steps (shards, global gradient norm, gathers, slices for checkpoints).
#include <tandem/runtime/sharded_data_parallel.h>

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/memory/cpu_allocator.h>
#include <tandem/runtime/grad_norm.h>
#include <tandem/runtime/step_scope.h>

#include "runtime/rank_agreement.h"
#include "runtime/sharded/sharded_state.h"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem {

using State = ShardedDataParallelCore::State;

namespace {

at::ScalarType wire_dtype_of(const ShardingOptions& s, const DistributedDataParallelOptions& ddp) {
  std::string wire = s.reduce_dtype;
  if (ddp.codec) {
    const std::string codec = ddp.codec->name();
    if (codec == "fp16" || codec == "bf16") {
      wire = codec;
    } else if (codec != "average") {
      throw ConfigError("tandem: ShardedDataParallel: gradient codec '" + codec +
                        "' needs an all-reduce of whole gradients; sharded gradients are "
                        "reduce-scattered. Use --set compression.codec=average, fp16 or bf16 with "
                        "--set sharding.stage=" + std::to_string(s.stage) +
                        ", or keep '" + codec + "' under DistributedDataParallel.");
    }
  }
  if (wire == "fp32") return at::kFloat;
  if (wire == "fp16") return at::kHalf;
  if (wire == "bf16") return at::kBFloat16;
  throw ConfigError("tandem: ShardedDataParallel: sharding.reduce_dtype '" + wire +
                    "' is not one of fp32, fp16, bf16 (--set sharding.reduce_dtype=bf16).");
}

}  // namespace

std::vector<MeshDim> sharding_mesh_dims(const ShardingOptions& sharding, int ranks,
                                        const std::string& what) {
  const ShardingPolicy shards = ShardingPolicy::of_stage(sharding.stage);
  if (!shards.optimizer_state && sharding.group_size != 0) {
    throw ConfigError("tandem: " + what + ": sharding.group_size " +
                      std::to_string(sharding.group_size) + " with sharding.stage=0, which shards "
                      "nothing; use --set sharding.group_size=0, or a stage of 1 to 3.");
  }
  // Nothing sharded: every rank is a shard group of its own, and the replicas all-reduce.
  const int group = !shards.optimizer_state ? 1
                    : sharding.group_size == 0 ? ranks
                                               : sharding.group_size;
  if (group < 1 || ranks % group != 0) {
    throw ConfigError("tandem: " + what + ": sharding.group_size " +
                      std::to_string(sharding.group_size) + " does not divide the " +
                      std::to_string(ranks) + " data-parallel ranks; use 0 (shard over all "
                      "ranks) or a divisor such as the ranks per node (--set sharding.group_size=" +
                      std::to_string(ranks) + ").");
  }
  return {{"dp_replicate", ranks / group}, {"dp_shard", group}};
}

namespace {

// A communicator handed to the wrapper, laid out as the options say.
std::shared_ptr<DeviceMesh> mesh_over(std::shared_ptr<Communicator> comm,
                                      const ShardingOptions& sharding) {
  if (!comm) throw ConfigError("tandem: ShardedDataParallel: communicator is null.");
  const int ranks = comm->size();
  return std::make_shared<DeviceMesh>(std::move(comm),
                                      sharding_mesh_dims(sharding, ranks, "ShardedDataParallel"));
}

}  // namespace

ShardedDataParallelCore::ShardedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<Communicator> comm,
                                                 ShardingOptions sharding,
                                                 DistributedDataParallelOptions ddp,
                                                 ShardedStart start)
    : ShardedDataParallelCore(std::move(module), mesh_over(std::move(comm), sharding), sharding,
                              std::move(ddp), start) {}

ShardedDataParallelCore::ShardedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<DeviceMesh> mesh,
                                                 ShardingOptions sharding,
                                                 DistributedDataParallelOptions ddp,
                                                 ShardedStart start)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  if (!module) throw ConfigError("tandem: ShardedDataParallel: module is null.");
  if (!mesh) throw ConfigError("tandem: ShardedDataParallel: the mesh is null.");
  s.shards = ShardingPolicy::of_stage(sharding.stage);
  // The mesh's data-parallel ranks must be laid out as the options ask.
  const int ranks = mesh->size("dp_replicate") * mesh->size("dp_shard");
  const std::vector<MeshDim> want = sharding_mesh_dims(sharding, ranks, "ShardedDataParallel");
  if (want[1].size != mesh->size("dp_shard")) {
    throw ConfigError("tandem: ShardedDataParallel: the mesh " + mesh->describe() + " shards over " +
                      std::to_string(mesh->size("dp_shard")) + " ranks, but sharding.stage=" +
                      std::to_string(sharding.stage) + " with sharding.group_size=" +
                      std::to_string(sharding.group_size) + " asks for " +
                      std::to_string(want[1].size) + "; build the mesh from the same options "
                      "(Context::mesh() does).");
  }
  if (sharding.backward_prefetch != "pre" && sharding.backward_prefetch != "post") {
    throw ConfigError("tandem: ShardedDataParallel: sharding.backward_prefetch '" +
                      sharding.backward_prefetch +
                      "' is not pre or post (--set sharding.backward_prefetch=post).");
  }
  s.caps = bucket_caps(ddp, "ShardedDataParallel");
  check_mixed_precision(ddp.mixed_precision, "ShardedDataParallel");
  s.wire_dtype = wire_dtype_of(sharding, ddp);
  s.mixed = ddp.mixed_precision;
  // Mixed precision without a cast on the wire: gradients travel in the dtype they are reduced in.
  if (s.mixed.enabled() && s.wire_dtype == at::kFloat) s.wire_dtype = s.mixed.reduce_dtype();
  s.module = std::move(module);
  s.options = std::move(sharding);
  s.ddp = std::move(ddp);
  s.connect(std::move(mesh));

  s.build_units();
  check_parameter_devices(s.params, s.names, s.ddp, "ShardedDataParallel");
  s.verify_same_everywhere();
  // Rank 0's values everywhere: each unit's flat buffer, then frozen parameters and buffers.
  {
    torch::autograd::AutoGradMode no_grad(false);
    for (auto& u : s.units) {
      if (u.numel == 0) continue;
      if (start == ShardedStart::kBroadcast) s.world->broadcast(u.flat, 0)->wait();
      const int64_t begin = static_cast<int64_t>(s.shard_rank()) * u.shard_numel;
      if (s.mixed.enabled()) s.lower_precision(u);  // the shard takes the fp32 values first
      if (s.shards.parameters) {
        if (!s.mixed.enabled()) {
          detail::copy_without_version_bump(u.shard, u.flat.narrow(0, begin, u.shard_numel));
        }
        detail::free_storage(u, s.params);
        u.materialized = false;
      }
      u.gathered_version = u.shard._version();
      u.stale = start == ShardedStart::kLoadedAfter;  // gathered once loaded, as reconnect() does
    }
    for (auto& t : s.frozen) {
      if (start == ShardedStart::kBroadcast) s.world->broadcast(t, 0)->wait();
      if (s.mixed.enabled() && t.is_floating_point()) t.set_data(t.detach().to(s.mixed.param_dtype));
    }
    if (start == ShardedStart::kBroadcast) {
      for (auto& t : s.buffers) s.world->broadcast(t, 0)->wait();
    }
  }
  s.accumulators = detail::GradAccumulators(s.params, state_);
  for (auto& p : s.params) s.param_versions.push_back(p._version());
}

ShardedDataParallelCore::~ShardedDataParallelCore() {
  // Units outlive the engine as plain modules.
  for (auto& item : state_->module->named_modules()) {
    if (auto* unit = dynamic_cast<detail::ShardedUnitBase*>(item.value().get())) unit->attach(nullptr, -1);
  }
}

void ShardedDataParallelCore::pre_forward() {
  State& s = *state_;
  // First, so a joined rank's shadow step (tandem/runtime/join.h) issues what follows in order.
  if (s.join_active && torch::autograd::GradMode::is_enabled()) detail::notify_join(*s.world, s.sync);
  std::lock_guard<std::mutex> lock(s.mutex);
  // Inside a fault-tolerant step: an abort drops what the step did (drop_step()).
  if (auto* scope = detail::StepScope::current()) scope->join(&s);
  const detail::BackwardPass::Mode before = s.backward.begin_forward();
  if (before == detail::BackwardPass::Mode::kSynchronizing ||
      before == detail::BackwardPass::Mode::kAccumulating) {
    // A forward without backward (evaluation): it armed nothing that was issued.
    s.last_forward_order = s.forward_order;
  }
  const bool fresh_gradients = before == detail::BackwardPass::Mode::kFinalized;
  s.gather_wait_seconds = 0;
  trace::Span span("sharded pre-forward", trace::kComm);
  if (fresh_gradients) {
    for (auto& u : s.units) u.stale = true;  // the optimizer consumed them: shards may have moved
  }
  if (!s.shards.gradients && fresh_gradients) {
    // The last synchronised backward was consumed by the optimizer step; accumulate anew.
    for (auto& u : s.units) {
      if (u.grad_flat.defined()) u.grad_flat.zero_();
    }
  }
  s.check_parameter_versions();
  s.forward_order.clear();
  for (size_t u = 0; u < s.units.size(); ++u) {
    s.units[u].forward_ran = false;
    if (s.shards.parameters && static_cast<int>(u) != s.root) s.release(static_cast<int>(u));
  }
  if (!s.shards.parameters) {
    for (size_t u = 0; u < s.units.size(); ++u) s.gather(static_cast<int>(u), false);
    for (size_t u = 0; u < s.units.size(); ++u) s.wait_gathered(static_cast<int>(u));
  } else {
    if (s.root >= 0) {
      s.gather(s.root, false);
      s.wait_gathered(s.root);
    }
    if (s.options.prefetch && !s.last_forward_order.empty()) s.gather(s.last_forward_order.front(), true);
  }
  for (size_t p = 0; p < s.params.size(); ++p) s.param_versions[p] = s.params[p]._version();
  memory::sample_allocator_counter();
}

void ShardedDataParallelCore::post_forward(const std::vector<at::Tensor>& outputs) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.shards.parameters && !s.order_checked) {
    // The collectives of every later step follow this order: it must be the same everywhere.
    std::string order;
    for (int u : s.forward_order) order += s.units[u].name + "\n";
    detail::check_same_on_every_rank(*s.shard_comm, order,
                                     "tandem: ShardedDataParallel: the ranks ran their units in "
                                     "different orders",
                                     "Every rank must run the same ShardedUnits in the same order "
                                     "in each forward.");
    s.order_checked = true;
  }
  bool any = false;
  for (const auto& o : outputs) any = any || (o.defined() && o.requires_grad());
  if (!torch::autograd::GradMode::is_enabled() || !any) {
    s.last_forward_order = s.forward_order;
    if (s.shards.parameters) {
      for (size_t u = 0; u < s.units.size(); ++u) s.release(static_cast<int>(u));
    }
    return;
  }
  s.arm_backward(outputs);
}

Communicator& ShardedDataParallelCore::join_communicator() { return *state_->world; }

void ShardedDataParallelCore::set_join_active(bool active) { state_->join_active = active; }

void ShardedDataParallelCore::shadow_step(bool sync) {
  State& s = *state_;
  const bool previous = s.sync;
  s.sync = sync;
  try {
    pre_forward();
    // Stage 3: each unit's forward gathers, in the order every rank ran them last step.
    if (s.shards.parameters) {
      for (int u : std::vector<int>(s.last_forward_order)) {
        s.before_forward(u);
        s.after_forward(u, {});
      }
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.arm_backward({});
    }
    s.finalize();  // no gradient arrives: every unit completes here, with zeros
  } catch (...) {
    s.sync = previous;
    throw;
  }
  s.sync = previous;
}

at::ScalarType ShardedDataParallelCore::input_dtype() const {
  return state_->mixed.enabled() ? state_->mixed.param_dtype : at::ScalarType::Undefined;
}

std::vector<at::Tensor> ShardedDataParallelCore::parameters() const {
  std::vector<at::Tensor> shards;
  for (const auto& u : state_->units) {
    if (u.numel > 0) shards.push_back(u.shard);
  }
  return shards;
}

double ShardedDataParallelCore::clip_grad_norm(double max_norm, double norm_type) {
  // The norm of each parameter's slice of the shards' gradients, in the model's parameter order:
  // at world 1 the partition and order of the plain model's own clip_grad_norm, so the same bits
  // (a norm taken over whole shards rounds differently, and under fp16 a last-bit difference of
  // the clipping factor grows into another trajectory). Replicas hold identical shards (hybrid):
  // the shard group alone covers every element once.
  const State& s = *state_;
  std::vector<at::Tensor> by_param(s.params.size());
  for (const auto& u : s.units) {
    if (u.numel == 0 || !u.shard.grad().defined()) continue;
    const at::Tensor& grad = u.shard.grad();
    const int64_t lo = static_cast<int64_t>(s.shard_rank()) * u.shard_numel;
    const int64_t hi = lo + u.shard_numel;
    for (size_t k = 0; k < u.params.size(); ++k) {
      const int64_t a = std::max(lo, u.offsets[k]);
      const int64_t b = std::min(hi, u.offsets[k] + s.params[u.params[k]].numel());
      if (a < b) by_param[u.params[k]] = grad.narrow(0, a - lo, b - a);
    }
  }
  return tandem::clip_gradients(by_param, max_norm, norm_type, state_->shard_comm.get());
}

void ShardedDataParallelCore::gather_parameters() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  for (size_t u = 0; u < s.units.size(); ++u) s.gather(static_cast<int>(u), false);
  for (size_t u = 0; u < s.units.size(); ++u) s.wait_gathered(static_cast<int>(u));
  for (size_t p = 0; p < s.params.size(); ++p) s.param_versions[p] = s.params[p]._version();
}

void ShardedDataParallelCore::check_optimizer_parameters(
    const std::vector<at::Tensor>& optimizer_params) const {
  const std::vector<at::Tensor> mine = parameters();
  bool same = optimizer_params.size() == mine.size();
  for (size_t i = 0; same && i < mine.size(); ++i) same = optimizer_params[i].is_same(mine[i]);
  if (same) return;
  for (const auto& t : optimizer_params) {
    for (size_t p = 0; p < state_->params.size(); ++p) {
      if (t.is_same(state_->params[p])) {
        throw ConfigError("tandem: ShardedDataParallel: the optimizer holds the model's parameter '" +
                          state_->names[p] + "'; with sharding it must step this rank's shards: "
                          "build it over ShardedDataParallel::parameters() (e.g. "
                          "torch::optim::AdamW opt(sdp.parameters(), lr)).");
      }
    }
  }
  throw ConfigError("tandem: ShardedDataParallel: the optimizer holds " +
                    std::to_string(optimizer_params.size()) + " tensors, not the " +
                    std::to_string(mine.size()) + " shards of ShardedDataParallel::parameters(); "
                    "build it over sdp.parameters().");
}

NoSyncGuard ShardedDataParallelCore::no_sync() { return NoSyncGuard(state_->sync); }

std::vector<ShardedDataParallelCore::ParameterSlice> ShardedDataParallelCore::unit_slices(
    size_t shard_index, const at::Tensor& shard) const {
  const State& s = *state_;
  size_t next = 0;
  for (const auto& u : s.units) {
    if (u.numel == 0 || next++ != shard_index) continue;
    if (shard.numel() != u.shard_numel) {
      throw ConfigError("tandem: ShardedDataParallel: expected " + std::to_string(u.shard_numel) +
                        " elements for unit '" + u.name + "' (shaped like parameters()[" +
                        std::to_string(shard_index) + "]), got " + std::to_string(shard.numel()) + ".");
    }
    std::vector<ParameterSlice> out;
    const int64_t lo = static_cast<int64_t>(s.shard_rank()) * u.shard_numel;
    const int64_t hi = lo + u.shard_numel;
    for (size_t k = 0; k < u.params.size(); ++k) {
      const at::Tensor& p = s.params[u.params[k]];
      const int64_t a = std::max(lo, u.offsets[k]);
      const int64_t b = std::min(hi, u.offsets[k] + p.numel());
      ParameterSlice slice;
      slice.name = s.names[u.params[k]];
      slice.shape = p.sizes().vec();
      slice.dtype = shard.scalar_type();
      slice.begin = a < b ? a - u.offsets[k] : 0;
      slice.end = a < b ? b - u.offsets[k] : 0;
      if (a < b) slice.data = shard.narrow(0, a - lo, b - a);
      out.push_back(std::move(slice));
    }
    return out;
  }
  throw ConfigError("tandem: ShardedDataParallel: no unit at parameters()[" +
                    std::to_string(shard_index) + "].");
}

std::vector<ShardedDataParallelCore::ParameterSlice> ShardedDataParallelCore::slices_of(
    const std::vector<at::Tensor>& shards) const {
  std::vector<ParameterSlice> out;
  for (size_t i = 0; i < shards.size(); ++i) {
    for (auto& slice : unit_slices(i, shards[i])) out.push_back(std::move(slice));
  }
  return out;
}

std::vector<ShardedDataParallelCore::ParameterSlice> ShardedDataParallelCore::parameter_slices() const {
  std::vector<at::Tensor> shards;
  for (const auto& t : parameters()) shards.push_back(t.detach());
  return slices_of(shards);
}

const ShardingOptions& ShardedDataParallelCore::options() const { return state_->options; }
int ShardedDataParallelCore::stage() const { return state_->options.stage; }
const ShardingPolicy& ShardedDataParallelCore::policy() const { return state_->shards; }

ShardingPolicy ShardingPolicy::of_stage(int stage) {
  if (stage < 0 || stage > 3) {
    throw ConfigError("tandem: ShardedDataParallel: sharding.stage is " + std::to_string(stage) +
                      "; use 0 (nothing sharded), 1 (optimizer state), 2 (+ gradients) or 3 "
                      "(+ parameters), e.g. --set sharding.stage=3.");
  }
  return {stage >= 1, stage >= 2, stage >= 3};
}
int ShardedDataParallelCore::shard_rank() const { return state_->shard_rank(); }
int ShardedDataParallelCore::shard_size() const { return state_->shard_size(); }

ShardedDataParallelCore::MemoryUse ShardedDataParallelCore::memory_use() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  MemoryUse m;
  const auto bytes = [](const at::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  for (const auto& u : s.units) {
    if (u.numel == 0) continue;
    m.parameter_bytes += s.shards.parameters ? bytes(u.shard) + (u.materialized ? bytes(u.flat) : 0)
                                             : bytes(u.flat);
    m.gradient_bytes += bytes(u.grad_flat) + (s.shards.gradients ? bytes(u.grad_shard) : 0);
  }
  for (const auto& p : s.params) {
    if (s.shards.gradients && p.grad().defined()) m.gradient_bytes += bytes(p.grad());
  }
  return m;
}

ShardedDataParallelCore::StepTimes ShardedDataParallelCore::last_step_times() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  return {s.gather_wait_seconds, s.reduce_wait_seconds, s.overlap_seconds};
}

std::vector<std::string> ShardedDataParallelCore::describe_units() const {
  std::vector<std::string> out;
  for (const auto& u : state_->units) {
    out.push_back(u.name + ": " + std::to_string(u.params.size()) + " parameters, " +
                  std::to_string(u.numel) + " elements, " + std::to_string(u.shard_numel) +
                  " per rank");
  }
  return out;
}

}  // namespace tandem
