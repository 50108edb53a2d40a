// Reducer: gradient bucketing with communication overlapped with backward.
//
// Parameters are grouped into buckets of one dtype, in reverse registration order (the order in
// which backward usually produces their gradients), the first bucket capped small so
// communication starts early. Each parameter's AccumulateGrad node gets a post hook: when a
// gradient is ready it is copied into its bucket (or already lives there, with
// gradient_as_bucket_view), and the moment a bucket's last gradient arrives the bucket is handed
// to the codec, whose all-reduce runs on the communicator's thread while backward continues.
// Buckets are launched strictly in bucket order, so every rank issues the same collectives in the
// same order. A callback queued on the autograd engine runs at the end of backward: it waits for
// every bucket and writes the averaged gradients into `.grad`. After the first synchronised
// iteration the buckets are rebuilt once from the observed gradient order (rank 0's order wins,
// so the plan is identical on every rank).
//
// Mixed precision: with grad_targets (fp32 masters of low-precision parameters), gradients are
// cast into buckets of options.mixed_precision.reduce_dtype() as they arrive and the averages land
// in the targets' .grad (as bucket views when the dtypes agree).
//
// Unused parameters (find_unused_parameters): after forward the autograd graph is walked from the
// outputs; parameters it does not reach are marked ready at once with a zero (or, after no_sync
// accumulation, their accumulated) gradient, and a used-map is all-reduced so parameters unused
// on every rank keep their `.grad` untouched (undefined if never set).
//
// Bucket planning is its own unit (tandem/runtime/bucket_plan.h); the options are
// DistributedDataParallel's (tandem/runtime/data_parallel.h).
//
// Ownership: shares the parameters, the communicator and the codec; owns the buckets and the
// grad-ready hooks, which hold the Reducer's state weakly (they do nothing once it is gone).
// Errors: the constructor throws ConfigError for mismatched names, a null communicator,
// non-positive caps (naming ddp.bucket_cap_mb) or a parameter that is not a leaf requiring grad; a forward that starts
// while the previous iteration's reduction is unfinished throws tandem::Error naming the buckets
// and parameters that never became ready; load_bucket_plan() throws as its comment says.
// Thread-safety: hooks may fire on autograd threads; the public methods are called from the
// training thread.
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/collectives/grad_codec.h>
#include <tandem/runtime/bucket_plan.h>
#include <tandem/runtime/data_parallel.h>

#include <memory>
#include <string>
#include <vector>

namespace tandem {

namespace detail {
struct ReducerState;
}

class Reducer {
 public:
  // `params` are leaf tensors requiring grad, `names` their qualified names (same length).
  // Of `options`: the caps, find_unused_parameters, gradient_as_bucket_view, overlap (kAuto:
  // overlap_pays()), the codec (null: average) and mixed_precision (the buckets' dtype).
  // `grad_targets` (empty: `params`) are the tensors whose .grad receive the averaged gradients,
  // one per parameter with as many elements (mixed precision: the fp32 masters); a parameter's own
  // .grad is then released once it has been copied into its bucket.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<Communicator> comm, const DistributedDataParallelOptions& options,
          std::vector<at::Tensor> grad_targets = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Before each forward: raises if the previous reduction is unfinished; rebuilds buckets once.
  void prepare_for_forward();
  // After a forward whose backward should synchronise: arms the hooks and, with
  // find_unused_parameters, marks parameters unreachable from `outputs` ready.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  // After a forward under no_sync: hooks only record which parameters were used.
  void prepare_for_accumulation();
  // A synchronised backward in which this rank has no gradient (Join: a rank out of data): every
  // bucket is reduced with zeros, in order, and the targets' .grad receive the average. Call
  // after prepare_for_forward(), like a forward's backward.
  void shadow_backward();

  // Current bucket plan as parameter indices (for tests, reports and checkpoints).
  std::vector<std::vector<int64_t>> bucket_plan() const;
  // Uses `plan` (a bucket_plan() saved after the rebuild, e.g. in a checkpoint) from now on,
  // instead of building one and rebuilding it after the first step, so a resumed run buckets -
  // and therefore sums and compresses - exactly like the run it resumes. Call on every rank
  // between steps. Throws ConfigError unless `plan` puts every parameter in exactly one bucket
  // of one dtype; Error during a backward.
  void load_bucket_plan(const std::vector<std::vector<int64_t>>& plan);
  bool buckets_rebuilt() const;
  // Synchronised steps whose reduction finished: the GradBucket::step of the next one.
  int64_t steps() const;
  const std::vector<std::string>& parameter_names() const;
  GradCodec& codec();
  const GradCodec& codec() const;
  // Of the last synchronised backward: seconds between the first bucket launch and the end of
  // backward (communication that overlapped compute), and seconds spent waiting afterwards.
  double last_overlap_seconds() const;
  double last_wait_seconds() const;

 private:
  std::shared_ptr<detail::ReducerState> state_;  // shared (weakly) with the autograd hooks
};

}  // namespace tandem
