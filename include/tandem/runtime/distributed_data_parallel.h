// DistributedDataParallel: DistributedDataParallel for libtorch C++ modules.
//
//   tandem::DistributedDataParallel ddp(model, dist.world, {.bucket_cap_mb = 25});
//   auto loss = torch::mse_loss(ddp(x), y);
//   loss.backward();          // buckets all-reduce while backward runs; .grad holds the average
//   opt.step();
//
// Construction is collective: every rank must pass a module with the same parameters (count,
// names, shapes, dtypes, order); otherwise every rank throws ConfigError naming the first
// mismatch. Then rank 0's parameters and buffers are broadcast (coalesced per dtype), so all
// replicas start identical. Each forward first broadcasts buffers (broadcast_buffers) and checks
// that the previous reduction finished; each backward after a forward in grad mode averages the
// gradients (see tandem/runtime/reducer.h for bucketing, overlap and unused parameters).
// `no_sync()` returns a guard under which forwards/backwards only accumulate; the next
// synchronised backward reduces the accumulated gradients.
//
// Ownership: shares the module, the communicator and the codec; owns its Reducer (buckets, hooks).
// Thread-safety: one training thread.
// Errors: ConfigError at construction (ranks with different models, bad options); tandem::Error
// from a forward when the previous backward's reduction never finished (a parameter got no
// gradient; see find_unused_parameters); CommError/TimeoutError from the communicator.
// Determinism: with the same seed and world size every rank holds bitwise-identical parameters
// after every step (the all-reduce gives every rank the same bits).
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/runtime/data_parallel.h>
#include <tandem/runtime/join.h>
#include <tandem/runtime/reducer.h>
#include <tandem/runtime/step_scope.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

class CheckpointManager;
namespace detail {
class MasterWeights;
}

// The non-template part of DistributedDataParallel (runtime/data_parallel.cpp).
class DistributedDataParallelCore : public detail::Joinable, private detail::StepParticipant {
 public:
  DistributedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                              std::shared_ptr<Communicator> comm,
                              DistributedDataParallelOptions options);
  ~DistributedDataParallelCore() override;

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);

  // While the guard lives, forwards and backwards only accumulate gradients locally.
  NoSyncGuard no_sync() { return NoSyncGuard(sync_); }

  // What a training-state checkpoint saves so a resumed run continues bit for bit: the bucket
  // plan once rebuilt ("ddp/bucket_sizes", "ddp/bucket_params", int64) and the codec's state
  // (per rank: error-feedback residuals differ between ranks). load_state() takes it back,
  // between steps, on every rank; ConfigError when it does not fit this model or codec.
  std::map<std::string, at::Tensor> state() const;
  void load_state(const std::map<std::string, at::Tensor>& state);

  // The tensors to build the optimizer over: the model's trainable parameters, or under mixed
  // precision their fp32 masters (the optimizer must step those; the next forward casts them
  // into the model).
  std::vector<at::Tensor> parameters() const;
  // Registers the model with `ckpt` as state `name` (kind "module", replicated): its parameters
  // under their names - the fp32 masters under mixed precision, so a resume is exact and the
  // checkpoint loads into an fp32 model too - and its buffers.
  void register_checkpoint(CheckpointManager& ckpt, const std::string& name);
  // Makes the model's parameters current between an optimizer step and the next forward (for
  // evaluation or saving): under mixed precision, casts the masters stepped since into the model;
  // otherwise there is nothing to do. Named as ShardedDataParallel's.
  void gather_parameters();
  // The dtype floating inputs are cast to (Undefined: none).
  at::ScalarType input_dtype() const;

  // Join (tandem/runtime/join.h).
  Communicator& join_communicator() override { return *comm_; }
  void set_join_active(bool active) override { join_active_ = active; }
  void shadow_step(bool sync) override;

  Reducer& reducer() { return *reducer_; }
  Communicator& communicator() { return *comm_; }
  const DistributedDataParallelOptions& options() const { return options_; }

 private:
  void broadcast_buffers();
  // An aborted fault-tolerant step (tandem/runtime/step_scope.h): the codec forgets what the
  // step did. The communicator was aborted: the wrapper is good for state() only, from which
  // the next world's wrapper is built.
  void drop_step() override;

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Communicator> comm_;
  DistributedDataParallelOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<at::Tensor> buffers_;
  bool sync_ = true;
  bool join_active_ = false;
  bool synced_ = false;  // a synchronised backward was armed since the last forward
  int64_t step_begun_ = 0;  // the reducer step of the fault-tolerant step in flight
  std::vector<at::Tensor> params_;                 // trainable, registration order
  std::shared_ptr<detail::MasterWeights> masters_;  // mixed precision only
};

template <class Module>
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<Module> module, std::shared_ptr<Communicator> comm,
                          DistributedDataParallelOptions options = {})
      : module_(std::move(module)),
        core_(std::make_unique<DistributedDataParallelCore>(module_, std::move(comm),
                                                            std::move(options))) {}
  // For module holders such as torch::nn::Sequential or TORCH_MODULE types.
  DistributedDataParallel(torch::nn::ModuleHolder<Module> holder,
                          std::shared_ptr<Communicator> comm,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(comm), std::move(options)) {}

  template <class... Args>
  auto forward(Args&&... args) {
    return detail::wrapped_forward(*core_, *module_, std::forward<Args>(args)...);
  }

  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // Gradient accumulation: `{ auto guard = ddp.no_sync(); loss(ddp(x)).backward(); }`.
  NoSyncGuard no_sync() { return core_->no_sync(); }

  // Bucket plan and codec state for checkpoints (see DistributedDataParallelCore::state()).
  std::map<std::string, at::Tensor> state() const { return core_->state(); }
  void load_state(const std::map<std::string, at::Tensor>& state) { core_->load_state(state); }

  // What to build the optimizer over (the fp32 masters under mixed precision).
  std::vector<at::Tensor> parameters() const { return core_->parameters(); }
  void register_checkpoint(CheckpointManager& ckpt, const std::string& name) {
    core_->register_checkpoint(ckpt, name);
  }
  void gather_parameters() { core_->gather_parameters(); }

  const std::shared_ptr<Module>& module() const { return module_; }
  Reducer& reducer() { return core_->reducer(); }
  DistributedDataParallelCore& core() { return *core_; }

 private:
  std::shared_ptr<Module> module_;
  std::unique_ptr<DistributedDataParallelCore> core_;
};

template <class Module>
DistributedDataParallel(std::shared_ptr<Module>, std::shared_ptr<Communicator>,
                        DistributedDataParallelOptions = {}) -> DistributedDataParallel<Module>;
template <class Module>
DistributedDataParallel(torch::nn::ModuleHolder<Module>, std::shared_ptr<Communicator>,
                        DistributedDataParallelOptions = {}) -> DistributedDataParallel<Module>;

}  // namespace tandem
