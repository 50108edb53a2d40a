// Internal to runtime/ddp: the Reducer's state, shared (weakly) with the autograd hooks. Its parts:
// the buckets and the launch of their reduction as gradients arrive (reducer_state.cpp), the
// unused-parameter handling (unused_parameters.cpp), and the public Reducer over it (reducer.cpp).
#pragma once

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/bucket_plan.h>
#include <tandem/runtime/reducer.h>

#include "runtime/data_parallel/backward_pass.h"
#include "runtime/data_parallel/grad_ready.h"

#include <torch/csrc/autograd/function.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::detail {

using ReducerClock = std::chrono::steady_clock;

struct ReducerState : GradReadyListener, std::enable_shared_from_this<ReducerState> {
  struct Bucket {
    GradBucket grads;
    int64_t pending = 0;
    WorkPtr work;
    int64_t launch_us = 0;  // trace: when the reduce was launched (0: not traced)
    uint64_t nvtx = 0;      // its NVTX range while in flight (0: none)
  };

  // finalize() waits for async checkpoint copies, so saves may defer them (checkpoint_manager.h).
  CheckpointStagingFence staging_fence;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> targets;  // whose .grad get the averages: `params`, or their masters
  std::vector<std::string> names;
  std::shared_ptr<Communicator> comm;
  DistributedDataParallelOptions options;
  BucketCaps caps;
  bool overlap = true;       // options.overlap resolved (overlap_pays)
  at::ScalarType reduce_dtype = at::ScalarType::Undefined;  // mixed precision; else each param's
  std::shared_ptr<GradCodec> codec;
  GradAccumulators accumulators;  // the grad-ready hooks (runtime/data_parallel/grad_ready.h)

  mutable std::mutex mutex;
  std::vector<Bucket> buckets;
  std::vector<std::pair<int64_t, int64_t>> location;  // param -> (bucket, slot)
  BackwardPass backward{"DistributedDataParallel"};  // mode, finalize callback, misuse checks
  std::vector<char> ready;
  std::vector<char> locally_used;     // since the last synchronised backward (no_sync included)
  int64_t next_launch = 0;
  std::vector<int64_t> deferred_unused;  // unreached by this forward; marked ready at first hook
  at::Tensor used_map;
  WorkPtr used_work;
  std::vector<int64_t> ready_order;   // hook order of the first synchronised backward
  std::vector<int64_t> rebuild_order; // set after the first synchronised backward
  bool rebuilt = false;
  int64_t step = 0;
  ReducerClock::time_point first_launch;
  double overlap_seconds = 0;
  double wait_seconds = 0;
  int64_t backward_begin_us = 0;  // trace: first grad hook of this backward (0: not traced)
  uint64_t backward_nvtx = 0;     // NVTX: this backward's range (0: none)

  // Buckets (reducer_state.cpp); the caller holds `mutex` unless said otherwise.
  // Parameter `param`'s slot in its bucket, shaped like the parameter.
  at::Tensor view(int64_t param) const;
  // The dtype of `param`'s bucket.
  at::ScalarType bucket_dtype(int64_t param) const;
  // Whether `param`'s target may hold its bucket slot as .grad (gradient_as_bucket_view).
  bool target_is_view(int64_t param) const;
  // Allocates the buckets of `plan`; with gradient_as_bucket_view, existing `.grad`s move in.
  void build(const BucketPlan& plan);
  // The plan for `order` under the options' caps.
  BucketPlan plan_for(const std::vector<int64_t>& order) const;
  // The bucket slot takes the parameter's current gradient (zeros when it has none).
  void copy_into_bucket(int64_t p);
  // Counts `p` ready and (with overlap) launches, in bucket order, every bucket that is complete.
  void mark_ready(int64_t p);
  // Launches, in bucket order, every complete bucket not launched yet.
  void launch_ready();
  void reset_iteration();
  // The grad-ready hook of parameter `p` (takes `mutex`).
  void on_grad_ready(int64_t p) override;
  // End of backward (an engine callback; takes `mutex`): waits for every bucket, writes `.grad`.
  void finalize();
  void trace_backward(ReducerClock::time_point wait_start, ReducerClock::time_point done);

  // Unused parameters (unused_parameters.cpp).
  // After a forward with find_unused_parameters: launches the all-reduce of the used-map and
  // defers the parameters `outputs` does not reach until backward starts.
  void find_unused(const std::vector<at::Tensor>& outputs);
  // At the first hook of a backward: the deferred parameters join their buckets.
  void mark_deferred_ready();
  // After the reduction: whether parameter `p` was used on some rank (true without a used-map).
  bool used_anywhere(int64_t p) const;
};

}  // namespace tandem::detail
