// PipelineParallel: runs a torch::nn::Sequential as pipeline stages over a Communicator.
//
//   auto groups = tandem::make_pipeline_groups(*dist.world, /*pipeline_size=*/2);  // 2D: p x dp
//   tandem::PipelineOptions opts;
//   opts.schedule = "zbh1";                 // gpipe | 1f1b | interleaved | zbh1, or a Schedule
//   opts.num_microbatches = 8;
//   tandem::PipelineParallel pipe(model, groups.pipeline, opts, groups.data);
//   auto loss = pipe.train_step(x, y, [](auto& out, auto& y) { return torch::mse_loss(out, y); });
//   opt.step(); opt.zero_grad();            // the optimizer holds pipe.parameters()
//
// Partitioning: the Sequential's children are the layers. `balance` gives the number of layers of
// each stage (p * v entries); without it the layers are split into contiguous stages that balance
// the parameter count, or (Partition::kProfile) the forward time measured on `profile_input`
// (measured on every rank and summed over the group, so all ranks agree). Stage s runs on
// pipeline rank s % p; a rank keeps only the layers of its stages (the PipelineParallel holds no
// reference to the others, so they are freed once the caller drops the full model).
//
// A step: the batch is cut into m microbatches along dim 0 (at::tensor_split: sizes differ by at
// most 1); `input` is read on the rank of stage 0, `target` on the rank of the last stage (other
// ranks may pass undefined tensors). The schedule is executed action by action; activations go
// forward and input gradients backward over the pipeline communicator with one tag per (direction,
// stage, microbatch). Shapes and dtypes of activations are sent once, before the data, and again
// whenever the shape or dtype of `input` changes (stage outputs must depend on the input's shape
// only); gradients have their activation's shape. Over a backend without message tags
// (Communicator::p2p_tags false: NCCL) the sends and receives go where pipeline::lower_untagged()
// puts them (one global order of point-to-point ops), each run of consecutive SEND/RECV actions
// is posted as one batch (Communicator::send_recv), and nothing is received ahead; a step with
// new shapes posts them one by one, each activation's shape right before it. Loss: LossReduction::kMean (default) makes the
// step's loss the mean of the m microbatch losses, so with a `mean` loss function and equal
// microbatches the gradient equals the full-batch gradient; kSum sums them. Gradients accumulate
// into `.grad` like loss.backward() does (call zero_grad() between steps, or not, to accumulate
// gradients over several steps). With a data-parallel communicator, after the schedule each
// stage's gradients are averaged over its data-parallel group (one all-reduce per dtype), and at
// construction its parameters and buffers are broadcast from data-parallel rank 0.
//
// Errors: ConfigError, the same on every rank, never a hang, when ranks disagree on the schedule
// (fingerprint), microbatch count, stage count, layer count or balance; the schedule cannot be
// built (e.g. 1F1B with fewer microbatches than stages) or fails validate(); fewer samples than
// microbatches; a schedule whose ranks or stages do not fit the group; at a step without tags,
// a schedule that fails validate_untagged(). Communication failures are
// CommError/TimeoutError from the communicator.
//
// Recording: every action's start and end (steady clock, seconds from the step's start, which is a
// synchronisation point of the group) are kept for the last step; per-stage F/B/I/W times
// accumulate until reset_stats(). measured_costs(), measured_bubble(), gather_timeline() and
// suggest_balance() are collective over the pipeline group.
//
// Backward: B is autograd's backward, except on stages whose parameter layers are all
// torch::nn::Linear, where it runs as I then W (faster there); I is autograd to the stage input
// and each parameter layer's output; W computes Linear weight gradients by hand and other
// layers' with autograd restricted to their parameters. Results equal autograd's within float
// rounding (tested to 1e-5 relative against the full model).
//
// Ownership: shares the communicators; owns the stage layers it keeps and one thread,
// "tandem-pp-send", that posts sends in action order (joined by the destructor). Thread-safety:
// one thread per rank calls it; not reentrant.
#pragma once

#include <ATen/core/Tensor.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/device_mesh.h>
#include <tandem/runtime/pipeline_schedule.h>
#include <tandem/runtime/pipeline_simulate.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

enum class LossReduction { kMean, kSum };
enum class Partition { kParameters, kProfile };

struct PipelineOptions {
  // Built-in schedule by name (see pipeline::build_schedule) ...
  std::string schedule = "1f1b";
  int num_microbatches = 4;
  int virtual_stages = 1;  // v: stages per rank, for "interleaved"
  // ... or a schedule of your own (compute-only or lowered; validated at construction). Its
  // num_ranks must equal the group size and num_stages the number of stages.
  std::optional<pipeline::Schedule> custom_schedule;
  // Layers per stage; empty: by `partition`.
  std::vector<int64_t> balance;
  Partition partition = Partition::kParameters;
  at::Tensor profile_input;  // for Partition::kProfile: a sample input batch (on every rank)
  LossReduction reduction = LossReduction::kMean;
};

// Pipeline and data-parallel groups of a 2D layout: world rank r is pipeline rank r % p of
// pipeline group r / p, and data-parallel rank r / p of data group r % p. Collective over
// `world`; ConfigError unless pipeline_size divides world.size(). Both groups are communicators
// of their own (`world` is borrowed, never handed back).
struct PipelineGroups {
  std::shared_ptr<Communicator> pipeline;
  std::shared_ptr<Communicator> data;  // null when world.size() == pipeline_size
};
PipelineGroups make_pipeline_groups(Communicator& world, int pipeline_size);
// The same from a mesh's `pp` dimension (Context::mesh(), parallel.pp): the pipeline group, and
// the data group of every other dimension (null when they are all of size 1). The groups are the
// mesh's, shared with its other users. Collective over the mesh's world on first use.
PipelineGroups make_pipeline_groups(DeviceMesh& mesh);

// Contiguous split of `weights` into `parts` non-empty ranges minimising the largest sum;
// returns the sizes. ConfigError when parts > weights.size() or parts < 1. Pure.
std::vector<int64_t> partition_balanced(const std::vector<double>& weights, int parts);

using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

class PipelineParallel {
 public:
  PipelineParallel(torch::nn::Sequential model, std::shared_ptr<Communicator> pipeline,
                   PipelineOptions options = {}, std::shared_ptr<Communicator> data = nullptr);
  ~PipelineParallel();
  PipelineParallel(const PipelineParallel&) = delete;
  PipelineParallel& operator=(const PipelineParallel&) = delete;

  // One step of the schedule (collective over the pipeline group, then the data group). Returns
  // the step's loss (reduced per `reduction`, detached) on the last stage's rank, an undefined
  // tensor elsewhere.
  at::Tensor train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss);

  // Parameters of this rank's stages (for the optimizer), in stage then layer order.
  std::vector<at::Tensor> parameters() const;
  std::vector<int> local_stages() const;
  // Layers of local stage `stage` (a global stage index this rank holds).
  torch::nn::Sequential stage_module(int stage) const;
  const std::vector<int64_t>& balance() const;
  // The lowered schedule this rank executes.
  const pipeline::Schedule& schedule() const;

  // Last step, this rank: every action with start/end seconds from the step's start.
  const std::vector<pipeline::TimedAction>& last_timeline() const;
  // Last step, this rank: the largest number of bytes of stage inputs and layer outputs held for
  // backward at once (from F to the microbatch's B, or W), per local stage.
  std::vector<int64_t> peak_activation_bytes() const;
  // Collective: mean measured seconds per stage of F, I, W and B since reset_stats() (stages that
  // ran no I/W get I = B and W = 0, those with no B get B = I + W). The transfer terms (comm) are
  // left at zero: fit them with pipeline::measured_comm_costs on gather_timeline() of each step.
  pipeline::Costs measured_costs();
  // Collective: the last step's bubble per pipeline rank: 1 - busy / (step wall time), each rank
  // on its own clock from the step's synchronised start until its last action and sends are done.
  std::vector<double> measured_bubble();
  // Collective: every rank's last_timeline() on the steady clock, shifted so the earliest action
  // starts at 0. Ranks on one host share that clock (CLOCK_MONOTONIC); across hosts the clocks
  // are not aligned and cross-rank gaps mean nothing.
  std::vector<pipeline::TimedAction> gather_timeline();
  // Collective: a balance (layers per stage) from the measured per-layer forward and backward
  // times since reset_stats(); construct a new PipelineParallel with it to re-balance.
  std::vector<int64_t> suggest_balance();
  void reset_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
