// Activation checkpointing: trade compute for memory by recomputing a function in backward.
//
//   auto y = tandem::activation_checkpoint([&](const std::vector<at::Tensor>& in) {
//     return std::vector<at::Tensor>{block->forward(in[0])};
//   }, {x})[0];
//   tandem::CheckpointedSequential net(seq, tandem::ActivationCheckpointPolicy::sqrt());  // √n
//   segments
//
// What it does: `activation_checkpoint(fn, inputs)` returns fn's outputs but keeps no activation of
// fn alive, only (detached aliases of) its inputs; backward re-runs fn with grad enabled and
// back-propagates through that recomputed graph. Gradients reach the inputs that require grad
// and every tensor requiring grad that fn uses without taking it as an input (parameters of
// captured modules, other captured tensors) through the *outer* backward: their AccumulateGrad
// nodes run once per backward in the caller's graph, so DistributedDataParallel's hooks fire once
// per parameter per step, and `torch::autograd::grad` / `backward(inputs=...)` through a checkpoint
// work (unlike PyTorch's reentrant checkpoint).
//
// How fn's captured tensors are found: with `options.parameters` unset, the first forward runs fn
// with grad enabled, walks the graph it built to the tensors fn captured, and frees that graph as
// soon as fn returns (so at most one checkpointed function's activations are alive at a time);
// with `options.parameters` set (CheckpointedSequential sets it to each segment's parameters), the
// forward runs under no-grad and those tensors plus the inputs are all fn may differentiate
// through. Either way the recompute checks that fn reached nothing else and throws otherwise.
//
// RNG and autocast: the default CPU generator's state (and the default CUDA generators of the
// CUDA devices of the inputs, on CUDA builds) is captured before the forward and set again for
// the recompute, so dropout draws the same masks; the caller's generator state is put back after
// the recompute, so backward leaves the caller's random stream where it was. Autocast state
// (enabled flags and dtypes, CPU and CUDA) is captured and restored the same way.
//
// Ownership: the returned outputs' grad_fn owns fn (copied), the saved inputs and the RNG state
// until backward without retain_graph releases them. Thread-safety: checkpoints on different
// threads are independent, except that RNG preservation reads and writes the process-global
// default generator; if other threads draw random numbers concurrently, pass
// `preserve_rng_state = false` or seed per thread with explicit generators.
//
// Errors: ActivationCheckpointError (a tandem::Error) for backward through a checkpoint a second
// time after its saved inputs were released (retain_graph = false; with retain_graph = true a
// second backward recomputes and works); an input modified in place between forward and
// backward; recomputed outputs differing from the first forward (count, shape, dtype, device;
// values too with RecomputeCheck::kValues); fn reaching a tensor requiring grad in the recompute
// that the forward did not see (or that options.parameters does not list).
// Unsupported (also ActivationCheckpointError): double backward (backward/grad with
// create_graph = true) through a checkpoint. Not detected: fn modifying its inputs or captured
// tensors in place, and module buffers updated in forward (BatchNorm running statistics are
// updated again by the recompute, as in PyTorch).
#pragma once

#include <tandem/base/errors.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem {

// A checkpoint was misused (second backward after release, double backward, input modified in
// place) or its recompute did not reproduce the first forward.
class ActivationCheckpointError : public Error {
 public:
  using Error::Error;
};

// What the recompute compares with the first forward.
enum class RecomputeCheck {
  kNone,      // nothing
  kMetadata,  // number of outputs, and each output's shape, dtype and device (free; the default)
  kValues,    // metadata and exact values: keeps a copy of every output until backward (costs
              // the outputs' memory; for debugging)
};

struct ActivationCheckpointOptions {
  // Names the checkpoint in error messages ("segment 2 of 4 (modules 4..7)").
  std::string name = "checkpoint";
  // Capture the RNG state before the forward and replay it in the recompute (see above).
  bool preserve_rng_state = true;
  RecomputeCheck check = RecomputeCheck::kMetadata;
  // Unset: discover the tensors fn captures by running the first forward with grad enabled.
  // Set: fn differentiates only through its inputs and these tensors (usually parameters); the
  // forward runs under no-grad, and a recompute reaching anything else throws.
  std::optional<std::vector<at::Tensor>> parameters;
};

// A checkpointable function: inputs in, outputs out. Non-tensor arguments are captured by the
// callable (copied into the autograd graph with it). fn must be deterministic given its inputs,
// captured state and the RNG state, and must not modify its inputs in place.
using ActivationCheckpointFunction =
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs) as described at the top of this file and returns its outputs. Outputs that
// can carry a gradient get the checkpoint as grad_fn; others (integer tensors, outputs that do
// not depend on anything requiring grad) are returned detached. Undefined inputs and inputs that
// do not require grad are passed through to fn as they are. With grad mode disabled, or nothing
// requiring grad, this is just fn(inputs).
std::vector<at::Tensor> activation_checkpoint(ActivationCheckpointFunction fn,
                                              const std::vector<at::Tensor>& inputs,
                                              ActivationCheckpointOptions options = {});

// One tensor in, one out: `tandem::activation_checkpoint([&](const at::Tensor& x) { return mlp(x);
// }, x)`.
template <class F, class = std::enable_if_t<std::is_convertible_v<
                       std::invoke_result_t<F&, const at::Tensor&>, at::Tensor>>>
at::Tensor activation_checkpoint(F fn, const at::Tensor& input,
                                 ActivationCheckpointOptions options = {}) {
  return activation_checkpoint(
      ActivationCheckpointFunction([fn = std::move(fn)](const std::vector<at::Tensor>& in) mutable {
        return std::vector<at::Tensor>{fn(in[0])};
      }),
      std::vector<at::Tensor>{input}, std::move(options))[0];
}

// ---------------------------------------------------------------------------------------------
// Checkpointing a torch::nn::Sequential

// A run of consecutive modules [begin, end) of a Sequential, run as one checkpoint or not.
struct ActivationCheckpointSegment {
  std::size_t begin = 0;
  std::size_t end = 0;
  bool checkpointed = false;
};

// Which modules of a Sequential run inside checkpoints.
//
// segments(n), every(k) and sqrt() cut the Sequential into runs of consecutive modules; the last
// run stays unchecked by default (as torch.utils.checkpoint.checkpoint_sequential does): its
// activations are needed by backward right away, so checkpointing it would only add its
// recompute, without lowering the peak (that peak is one segment's activations either way).
// checkpoint_last(true) checkpoints it too. select(pick) checkpoints exactly the modules pick
// accepts, each on its own, and runs every other module plainly.
class ActivationCheckpointPolicy {
 public:
  using Picker = std::function<bool(const std::string& name, const torch::nn::Module& module)>;

  // No checkpointing: one unchecked segment.
  static ActivationCheckpointPolicy none();
  // n runs of (nearly) equal module counts, earlier runs one longer when n does not divide.
  // n >= 1 (ConfigError otherwise); n larger than the module count gives one module per run.
  static ActivationCheckpointPolicy segments(std::int64_t n);
  // Runs of k modules (k >= 1), the last one possibly shorter.
  static ActivationCheckpointPolicy every(std::int64_t k);
  // round(√n) runs for n modules: memory O(√n) activations at the cost of one extra forward.
  static ActivationCheckpointPolicy sqrt();
  // Each module with pick(name, module) true in its own checkpoint. `name` is the child's name
  // in the Sequential ("0", "1", ... or the names given), module.name() its demangled type name
  // ("torch::nn::LinearImpl", "BlockImpl"); or test the type with
  // `dynamic_cast<const torch::nn::LinearImpl*>(&module)`.
  static ActivationCheckpointPolicy select(Picker pick);

  // For segments/every/sqrt: checkpoint the last run too (default false).
  ActivationCheckpointPolicy& checkpoint_last(bool on) {
    checkpoint_last_ = on;
    return *this;
  }

  // The runs for a Sequential with these children (in order).
  std::vector<ActivationCheckpointSegment> plan(
      const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& children)
      const;

  // "sqrt", "segments(4)", "every(2)", "select", "none" (plus "+last").
  std::string describe() const;

 private:
  enum class Kind { kNone, kSegments, kEvery, kSqrt, kSelect };
  Kind kind_ = Kind::kNone;
  std::int64_t n_ = 1;
  Picker pick_;
  bool checkpoint_last_ = false;
};

// A torch::nn::Sequential whose forward runs per ActivationCheckpointPolicy. The Sequential's
// children are registered under their own names, so parameters(), named_parameters() and state
// dicts match the wrapped Sequential's ("0.weight", ...), and the wrapped Sequential stays usable
// (same modules). Every module must map one tensor to one tensor. Each checkpointed run declares
// its modules' parameters (ActivationCheckpointOptions::parameters), so its forward runs under
// no-grad; a module using a tensor requiring grad that is not one of the run's parameters makes
// backward throw ActivationCheckpointError naming the run. Thread-safety: as torch::nn::Module.
class CheckpointedSequentialImpl : public torch::nn::Module {
 public:
  // `options.name` prefixes each run's name; options.parameters is ignored (set per run).
  CheckpointedSequentialImpl(torch::nn::Sequential sequential, ActivationCheckpointPolicy policy,
                             ActivationCheckpointOptions options = {});

  at::Tensor forward(const at::Tensor& input);

  const std::vector<ActivationCheckpointSegment>& segments() const { return segments_; }
  const torch::nn::Sequential& sequential() const { return sequential_; }
  // Human-readable plan: "4 runs: [0,4) ckpt, [4,8) ckpt, [8,12) ckpt, [12,16) plain".
  std::string describe() const;

 private:
  torch::nn::Sequential sequential_;
  ActivationCheckpointPolicy policy_;
  ActivationCheckpointOptions options_;
  std::vector<ActivationCheckpointSegment> segments_;
};
TORCH_MODULE(CheckpointedSequential);

}  // namespace tandem
