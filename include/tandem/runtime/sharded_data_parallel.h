// ShardedDataParallel: data parallelism whose training state is sharded across ranks (ZeRO
// stages 1-3, PyTorch FSDP's FULL_SHARD and HYBRID_SHARD) for libtorch C++ modules.
//
//   tandem::ShardedDataParallel sdp(model, ctx.world(), ctx.config().sharding, ctx.config().ddp);
//   torch::optim::AdamW opt(sdp.parameters(), lr);      // the optimizer sees only this rank's shards
//   auto loss = torch::mse_loss(sdp(x), y);
//   loss.backward();          // gradients are reduce-scattered into the shards while backward runs
//   sdp.clip_grad_norm(1.0);  // optional: the norm over every shard of every rank
//   opt.step();               // steps the shards; the next forward all-gathers what changed
//
// Layout: the model's parameters are grouped into units and each unit's parameters are laid out
// back to back in one flat buffer (padded to a multiple of the shard-group size); rank r owns
// elements [r * S, (r + 1) * S) of every unit. `parameters()` returns one leaf tensor per unit,
// this rank's slice, and the optimizer steps those; since AdamW, Adam, SGD and the other
// element-wise optimizers treat every element alike, stepping slices equals stepping the whole.
// A stage is what it shards (ShardingPolicy):
//   stage 0: nothing: every rank holds the whole unit and the replicas all-reduce its gradients
//            (DistributedDataParallel's semantics; that wrapper is the faster choice).
//   stage 1: full parameters and gradients stay on every rank; the optimizer state is sharded.
//            Units are gradient buckets (ddp.bucket_cap_mb), reduced while backward runs.
//   stage 2: gradients are sharded too: a bucket's gradients are reduce-scattered as soon as
//            they are ready and only this rank's slice is kept.
//   stage 3: parameters are sharded too: a unit's full parameters exist only while it runs
//            forward or backward; the next unit's all-gather is issued while this one computes.
//            Units are the model's ShardedUnit submodules (below); parameters in no unit form the
//            root unit, gathered for the whole step.
//   hybrid:  options.group_size = k < world size shards inside groups of k consecutive ranks
//            (one node) and all-reduces the shards across the groups (HSDP).
// Ranks: a communicator (the wrapper lays it out as sharding_mesh_dims() says), or a DeviceMesh
// with dimensions dp_replicate and dp_shard, such as Context::mesh(): the wrapper then takes its
// groups from that mesh and shares them with every other user of it.
// Memory per parameter with fp32 AdamW on N ranks: 4 + 4 + 8/N bytes (stage 1), 4 + 12/N (2),
// 16/N plus the units being computed (3), against 16 for DistributedDataParallel.
// Mixed precision (ddp.mixed_precision, tandem/runtime/mixed_precision.h): the shards are fp32
// masters, the model's parameters and gradients are in param_dtype, gradients are reduced in fp32
// or param_dtype; checkpoints and export_model() hold the fp32 masters.
//
// Units (stage 3): libtorch's C++ modules have no forward hooks (pytorch#25888), so a unit is
// declared by wrapping a submodule in ShardedUnit where the model builds it:
//   blocks.push_back(register_module("block" + std::to_string(i), tandem::ShardedUnit<BlockImpl>(Block(cfg))));
//   ...  x = blocks[i](x);          // gathers, runs Block::forward, frees (reshard_after_forward)
// A ShardedUnit registers the wrapped module's parameters, buffers and children under their own
// names, so state dicts and checkpoints keep the plain model's names; outside a stage-3
// ShardedDataParallel it is the plain module. Activation checkpointing works inside a unit (the
// recompute runs while the unit is gathered for backward).
//
// Construction is collective: every rank must pass the same model (parameter names, shapes,
// dtypes, order) and the same units; otherwise every rank throws ConfigError naming the first
// difference. Rank 0's parameters and buffers are broadcast first (unless ShardedStart::
// kLoadedAfter). Under step-level fault tolerance, reconnect() carries the wrapper onto a new
// epoch's communicator (hybrid sharding heals a replacement from its replica; fault_tolerance.md).
// Ownership: shares the module and the communicator; owns the flat buffers and the shards (the
// module's parameters become views of the flat buffers). Thread-safety: one training thread;
// autograd hooks may run on autograd threads.
// Errors: ConfigError for bad options, a parameter in two units, models or units that differ
// across ranks, a unit with parameters of two dtypes; tandem::Error for an optimizer that stepped
// the model's parameters instead of parameters(), a unit run twice in one forward, or a forward
// while the previous reduction is unfinished; CommError/TimeoutError from the collectives.
#pragma once

#include <tandem/base/file_system.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/device_mesh.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/join.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace tandem {

class CheckpointManager;

// Config section `sharding` (docs/sharded_data_parallel.md).
struct ShardingOptions {
  int stage = 0;                      // sharding.stage: 0 = nothing sharded (replicate), 1, 2 or 3
  bool reshard_after_forward = true;  // sharding.reshard_after_forward: stage 3 frees a unit's
                                      // full parameters after its forward (false: after backward)
  bool prefetch = true;               // sharding.prefetch: gather the next unit while one computes
  std::string backward_prefetch = "post";  // sharding.backward_prefetch: in backward, gather the
                                      // next unit when the current one's backward starts ("pre":
                                      // more overlap, four units' worth beside the shards) or
                                      // when its gradients are in ("post": three)
  int group_size = 0;                 // sharding.group_size: ranks a shard spans (0: all; hybrid
                                      // sharding across groups otherwise; must divide the world)
  std::string reduce_dtype = "fp32";  // sharding.reduce_dtype: fp32 | fp16 | bf16 on the wire
};

// The data-parallel layout `sharding` asks of `ranks` ranks: {{"dp_replicate", ranks / g},
// {"dp_shard", g}}, g the ranks one shard spans (1 at stage 0, which shards nothing; sharding.
// group_size, 0 meaning all). ConfigError, naming the key, for a group_size that does not divide
// `ranks` or that is set at stage 0. `what` starts the messages ("ShardedDataParallel").
std::vector<MeshDim> sharding_mesh_dims(const ShardingOptions& sharding, int ranks,
                                        const std::string& what);

// What a stage shards, each stage adding one: optimizer state (1), gradients (2), parameters (3).
struct ShardingPolicy {
  bool optimizer_state = false;
  bool gradients = false;
  bool parameters = false;
  // Throws ConfigError (naming sharding.stage) outside 0..3.
  static ShardingPolicy of_stage(int stage);
};

class ShardedDataParallelCore;

// Where a new ShardedDataParallel's values come from.
enum class ShardedStart {
  kBroadcast,    // rank 0's parameters and buffers, broadcast by the constructor
  kLoadedAfter,  // the caller loads them before the first forward (CheckpointManager::heal() or
                 // resume()); the constructor broadcasts nothing, so a replacement's constructor
                 // runs the collectives of the survivors' reconnect() (fault_tolerance.h)
};

namespace detail {

// What a ShardedUnit reports to the engine that owns it (set when a stage-3 ShardedDataParallel
// takes the model; null otherwise).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Before the wrapped forward: makes the unit's full parameters available.
  virtual void before_forward(int unit) = 0;
  // After it: ties the unit's pre-backward to `outputs` and frees the parameters.
  virtual std::vector<at::Tensor> after_forward(int unit, std::vector<at::Tensor> outputs) = 0;
};

// The non-template part of ShardedUnit.
class ShardedUnitBase : public torch::nn::Module {
 public:
  // Adopts `inner`'s direct parameters, buffers and children under their own names.
  explicit ShardedUnitBase(std::shared_ptr<torch::nn::Module> inner);
  const std::shared_ptr<torch::nn::Module>& inner_module() const { return inner_; }

  // Set by ShardedDataParallel (stage 3).
  void attach(UnitHooks* hooks, int unit) {
    hooks_ = hooks;
    unit_ = unit;
  }
  UnitHooks* hooks() const { return hooks_; }
  int unit() const { return unit_; }

 private:
  std::shared_ptr<torch::nn::Module> inner_;
  UnitHooks* hooks_ = nullptr;
  int unit_ = -1;
};

// Replaces the tensors of `output` (a tensor, vector, tuple or pair of them) by `replaced`, in
// the order collect_tensors() lists them.
inline void replace_tensors(at::Tensor& t, std::vector<at::Tensor>& r, size_t& i) { t = r.at(i++); }
inline void replace_tensors(std::vector<at::Tensor>& ts, std::vector<at::Tensor>& r, size_t& i) {
  for (auto& t : ts) t = r.at(i++);
}
template <class... T>
void replace_tensors(std::tuple<T...>& t, std::vector<at::Tensor>& r, size_t& i) {
  std::apply([&](auto&... e) { (replace_tensors(e, r, i), ...); }, t);
}
template <class A, class B>
void replace_tensors(std::pair<A, B>& p, std::vector<at::Tensor>& r, size_t& i) {
  replace_tensors(p.first, r, i);
  replace_tensors(p.second, r, i);
}
template <class T>
void replace_tensors(T&, std::vector<at::Tensor>&, size_t&) {}

}  // namespace detail

// A submodule that stage 3 gathers and frees as one unit (see the top of this file). `Impl` is
// the wrapped module's type (BlockImpl for a TORCH_MODULE(Block)).
template <class Impl>
class ShardedUnitImpl : public detail::ShardedUnitBase {
 public:
  explicit ShardedUnitImpl(std::shared_ptr<Impl> module)
      : ShardedUnitBase(module), module_(std::move(module)) {}
  explicit ShardedUnitImpl(torch::nn::ModuleHolder<Impl> holder) : ShardedUnitImpl(holder.ptr()) {}

  template <class... Args>
  auto forward(Args&&... args) {
    if (hooks() == nullptr) return module_->forward(std::forward<Args>(args)...);
    hooks()->before_forward(unit());
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    std::vector<at::Tensor> tied = hooks()->after_forward(unit(), std::move(tensors));
    size_t i = 0;
    detail::replace_tensors(output, tied, i);
    return output;
  }

  // The wrapped module.
  const std::shared_ptr<Impl>& module() const { return module_; }

 private:
  std::shared_ptr<Impl> module_;
};

// The holder a model keeps, as TORCH_MODULE makes one: `unit(x)` runs the unit's forward,
// `unit->module()` is the wrapped module. (A holder of its own, because libtorch's ModuleHolder
// cannot call a templated forward.)
template <class Impl>
class ShardedUnit : public torch::nn::ModuleHolder<ShardedUnitImpl<Impl>> {
 public:
  using Base = torch::nn::ModuleHolder<ShardedUnitImpl<Impl>>;
  using Base::Base;
  // What register_module() returns.
  ShardedUnit(Base holder) : Base(holder.ptr()) {}  // NOLINT(runtime/explicit)

  template <class... Args>
  auto operator()(Args&&... args) {
    return this->get()->forward(std::forward<Args>(args)...);
  }
};

// The non-template part of ShardedDataParallel (runtime/sharded/).
class ShardedDataParallelCore : public detail::Joinable {
 public:
  ShardedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<Communicator> comm, ShardingOptions sharding,
                          DistributedDataParallelOptions ddp,
                          ShardedStart start = ShardedStart::kBroadcast);
  // Over the data-parallel dimensions of `mesh` (dp_replicate, dp_shard; others, such as pp, are
  // the ranks this wrapper does not span). sharding.group_size must be 0 or dp_shard's size.
  ShardedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<DeviceMesh> mesh, ShardingOptions sharding,
                          DistributedDataParallelOptions ddp,
                          ShardedStart start = ShardedStart::kBroadcast);
  ~ShardedDataParallelCore() override;
  ShardedDataParallelCore(const ShardedDataParallelCore&) = delete;
  ShardedDataParallelCore& operator=(const ShardedDataParallelCore&) = delete;

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);

  // One leaf tensor per unit: this rank's slice of the unit's flat parameters (build the
  // optimizer over these). Stage 1-2: views of the full parameters; stage 3: their own memory.
  std::vector<at::Tensor> parameters() const;
  // Clips the gradients of parameters() so that the norm over every shard of every rank is at
  // most `max_norm`; returns that global norm (before clipping). norm_type 2 or inf.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  // Makes every full parameter current (all-gathers the shards stepped since the last gather):
  // for evaluating or exporting between an optimizer step and the next forward. Collective.
  // Stage 3 gathers every unit and keeps them until the next forward.
  void gather_parameters();
  // Throws ConfigError unless `optimizer_params` are exactly parameters() (an optimizer built over
  // the model's own parameters would update replicas that the next gather overwrites).
  void check_optimizer_parameters(const std::vector<at::Tensor>& optimizer_params) const;

  // While the guard lives, forwards and backwards only accumulate gradients locally.
  NoSyncGuard no_sync();

  // Step-level fault tolerance (tandem/runtime/fault_tolerance.h): moves onto `world`, the
  // communicator of a new epoch, keeping this rank's shards (so the optimizer over parameters()
  // and its state stay valid). Collective over `world`: every member calls reconnect(), except a
  // replacement, which builds its wrapper with ShardedStart::kLoadedAfter and is healed next. The
  // shard layout must survive: the shard-group size divides `world`'s size and this rank keeps its
  // position in its group (FaultTolerantWorld::heal_sources checks the whole world); ConfigError
  // otherwise. Call between steps. An aborted fault-tolerant step's gradients and in-flight
  // collectives were dropped when it aborted (the wrapper joins the step's scope, step_scope.h).
  void reconnect(std::shared_ptr<Communicator> world);
  // The same onto a mesh already rebuilt over the new epoch's world (DeviceMesh::rebuilt()), so
  // that its groups are shared with the mesh's other users.
  void reconnect(std::shared_ptr<DeviceMesh> mesh);

  // Writes the whole model - every parameter and buffer under its name - as one safetensors file
  // at `path` for inference (tandem/checkpoint/safetensors.h reads it back). Streams: one unit's
  // full parameters are gathered at a time, hashed, freed, then gathered again and written, so
  // no rank ever holds the whole model. Rank 0 writes; collective (every rank calls it, between
  // steps); throws CheckpointError on every rank when the write fails.
  void export_model(const std::string& path, std::shared_ptr<FileSystem> fs = nullptr);

  // Training-state checkpoints that reshard. register_checkpoint() adds state `name` (this
  // rank's slice of every parameter, keyed by the parameter's name and flattened range) and
  // `name`_buffers (buffers and frozen parameters, replicated); register_optimizer() adds the
  // optimizer's state the same way (its per-shard tensors sliced per parameter; options and step
  // counts as values). CheckpointManager::resume() then restores them at any world size, any
  // stage and any unit or bucket layout: each rank reads only the pieces that overlap its own
  // slices (Sharding::kSliced). The optimizer must be built over parameters() (ConfigError).
  void register_checkpoint(CheckpointManager& ckpt, const std::string& name);
  void register_optimizer(CheckpointManager& ckpt, const std::string& name,
                          torch::optim::Optimizer& optimizer);

  // How the flat layout maps the model's parameters, for checkpoints and exports.
  struct ParameterSlice {
    std::string name;            // the parameter's qualified name
    std::vector<int64_t> shape;  // its full shape
    at::ScalarType dtype;
    int64_t begin = 0;           // this rank's elements of the flattened parameter: [begin, end)
    int64_t end = 0;
    at::Tensor data;             // those elements (a view of the shard; empty when begin == end)
  };
  std::vector<ParameterSlice> parameter_slices() const;
  // The same for tensors shaped like parameters() (optimizer state such as exp_avg): `shards[u]`
  // is unit u's slice-shaped tensor.
  std::vector<ParameterSlice> slices_of(const std::vector<at::Tensor>& shards) const;
  // The slices of parameters()[shard_index]'s unit, with data from `shard` (shaped like it).
  std::vector<ParameterSlice> unit_slices(size_t shard_index, const at::Tensor& shard) const;

  const ShardingOptions& options() const;
  int stage() const;
  const ShardingPolicy& policy() const;
  // The dtype floating inputs of the forward are cast to (mixed precision), or Undefined.
  at::ScalarType input_dtype() const;
  // This rank's position in its shard group and the group's size.
  int shard_rank() const;
  int shard_size() const;
  // Bytes this rank holds now: full parameters, gradients (full and sharded), and the shards.
  struct MemoryUse {
    int64_t parameter_bytes = 0;
    int64_t gradient_bytes = 0;
  };
  MemoryUse memory_use() const;
  // Where the last synchronised step waited (from its forward to the end of its backward), for
  // benchmarks and progress lines: seconds blocked on all-gathers (stages 1-2: in the forward's
  // gather of the stepped shards; stage 3: before units that were not prefetched in time),
  // seconds blocked on reduce-scatters after backward, and seconds between the first
  // reduce-scatter and the end of backward (communication that overlapped compute).
  struct StepTimes {
    double gather_wait_seconds = 0;
    double reduce_wait_seconds = 0;
    double overlap_seconds = 0;
  };
  StepTimes last_step_times() const;
  // Units as "name: N parameters, M elements".
  std::vector<std::string> describe_units() const;
  // Names of the parameters in parameters()[shard_index].
  std::vector<std::string> unit_parameter_names(size_t shard_index) const;

  // Join (tandem/runtime/join.h).
  Communicator& join_communicator() override;
  void set_join_active(bool active) override;
  void shadow_step(bool sync) override;

  struct State;  // internal (runtime/sharded/sharded_state.h)
  State& internal_state() const { return *state_; }

 private:
  std::shared_ptr<State> state_;
};

// The wrapper a training loop uses (see the top of this file).
template <class Module>
class ShardedDataParallel {
 public:
  // `ranks`: a std::shared_ptr to a Communicator (laid out by sharding_mesh_dims()) or to a
  // DeviceMesh with dimensions dp_replicate and dp_shard (ShardedDataParallelCore's two forms).
  template <class Ranks>
  ShardedDataParallel(std::shared_ptr<Module> module, Ranks ranks, ShardingOptions sharding,
                      DistributedDataParallelOptions ddp = {},
                      ShardedStart start = ShardedStart::kBroadcast)
      : module_(std::move(module)),
        core_(std::make_unique<ShardedDataParallelCore>(module_, std::move(ranks),
                                                        std::move(sharding), std::move(ddp), start)) {}
  template <class Ranks>
  ShardedDataParallel(torch::nn::ModuleHolder<Module> holder, Ranks ranks, ShardingOptions sharding,
                      DistributedDataParallelOptions ddp = {},
                      ShardedStart start = ShardedStart::kBroadcast)
      : ShardedDataParallel(holder.ptr(), std::move(ranks), std::move(sharding), std::move(ddp),
                            start) {}

  template <class... Args>
  auto forward(Args&&... args) {
    return detail::wrapped_forward(*core_, *module_, std::forward<Args>(args)...);
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  std::vector<at::Tensor> parameters() const { return core_->parameters(); }
  double clip_grad_norm(double max_norm, double norm_type = 2.0) {
    return core_->clip_grad_norm(max_norm, norm_type);
  }
  void gather_parameters() { core_->gather_parameters(); }
  void export_model(const std::string& path) { core_->export_model(path); }
  void register_checkpoint(CheckpointManager& ckpt, const std::string& name) {
    core_->register_checkpoint(ckpt, name);
  }
  void register_optimizer(CheckpointManager& ckpt, const std::string& name,
                          torch::optim::Optimizer& optimizer) {
    core_->register_optimizer(ckpt, name, optimizer);
  }
  NoSyncGuard no_sync() { return core_->no_sync(); }
  void reconnect(std::shared_ptr<Communicator> world) { core_->reconnect(std::move(world)); }
  void reconnect(std::shared_ptr<DeviceMesh> mesh) { core_->reconnect(std::move(mesh)); }

  const std::shared_ptr<Module>& module() const { return module_; }
  ShardedDataParallelCore& core() { return *core_; }

 private:
  std::shared_ptr<Module> module_;
  std::unique_ptr<ShardedDataParallelCore> core_;
};

template <class Module, class Ranks>
ShardedDataParallel(std::shared_ptr<Module>, Ranks, ShardingOptions,
                    DistributedDataParallelOptions = {}, ShardedStart = ShardedStart::kBroadcast)
    -> ShardedDataParallel<Module>;
template <class Module, class Ranks>
ShardedDataParallel(torch::nn::ModuleHolder<Module>, Ranks, ShardingOptions,
                    DistributedDataParallelOptions = {}, ShardedStart = ShardedStart::kBroadcast)
    -> ShardedDataParallel<Module>;

}  // namespace tandem
