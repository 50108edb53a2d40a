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
#include <tandem/collectives/grad_codec.h>
#include <tandem/runtime/join.h>
#include <tandem/runtime/mixed_precision.h>
#include <tandem/runtime/reducer.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem {

class CheckpointManager;
namespace detail {
class MasterWeights;
}

struct DistributedDataParallelOptions {
  double bucket_cap_mb = 25.0;        // later buckets close at this size
  double first_bucket_cap_mb = 1.0;   // the first bucket is small so communication starts early
  bool find_unused_parameters = false;
  // .grad tensors live in the buckets: no copy in or out (measured: W1 step overhead 54% -> 22%).
  // They are plain tensors, so optimizers' zero_grad() works; set false to keep separate .grad.
  bool gradient_as_bucket_view = true;
  bool broadcast_buffers = true;         // rank 0's buffers to all ranks before each forward
  // ddp.overlap: reduce buckets while backward runs (kOn), after it (kOff), or kAuto: overlap
  // only when this host has a core to spare for communication (LOCAL_WORLD_SIZE x compute threads
  // < cores); without one, overlapped communication steals the compute's cores and costs more
  // than it hides (bench data_parallel on 2 cores).
  enum class Overlap { kAuto, kOn, kOff };
  Overlap overlap = Overlap::kAuto;
  std::shared_ptr<GradCodec> codec;      // null: average all-reduce
  MixedPrecisionOptions mixed_precision; // precision.param_dtype / precision.reduce_in_fp32
};

// The non-template part of DistributedDataParallel (runtime/data_parallel.cpp).
class DistributedDataParallelCore : public detail::Joinable {
 public:
  DistributedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                              std::shared_ptr<Communicator> comm,
                              DistributedDataParallelOptions options);
  ~DistributedDataParallelCore() override;

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);

  // While the guard lives, forwards and backwards only accumulate gradients locally.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallelCore& core);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallelCore& core_;
    bool previous_;
  };

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

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Communicator> comm_;
  DistributedDataParallelOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<at::Tensor> buffers_;
  bool sync_ = true;
  bool join_active_ = false;
  bool synced_ = false;  // a synchronised backward was armed since the last forward
  std::vector<at::Tensor> params_;                 // trainable, registration order
  std::shared_ptr<detail::MasterWeights> masters_;  // mixed precision only
};

namespace detail {

inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... T>
void collect_tensors(const std::tuple<T...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collect_tensors(e, out), ...); }, t);
}
template <class A, class B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collect_tensors(p.first, out);
  collect_tensors(p.second, out);
}
// Non-tensor outputs carry no gradient.
template <class T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

// The forward of a data-parallel wrapper: core.pre_forward(), the module's forward (floating
// inputs cast to core.input_dtype() under mixed precision), then core.post_forward() with the
// output's tensors (what backward starts from).
template <class Core, class Module, class... Args>
auto wrapped_forward(Core& core, Module& module, Args&&... args) {
  core.pre_forward();
  auto output = module.forward(cast_input(std::forward<Args>(args), core.input_dtype())...);
  std::vector<at::Tensor> tensors;
  collect_tensors(output, tensors);
  core.post_forward(tensors);
  return output;
}

}  // namespace detail

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
  DistributedDataParallelCore::NoSyncGuard no_sync() {
    return DistributedDataParallelCore::NoSyncGuard(*core_);
  }

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
