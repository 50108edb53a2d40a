// Internal: the state of one ShardedDataParallel - units, the collectives of a step in the one
// order every rank issues them, and the autograd hooks that drive them.
//
// Order of collectives: every rank must issue the same sequence on each communicator, whatever
// happens locally. Gathers and reduce-scatters run on two communicators of the same ranks, so
// each has an order of its own and neither waits for the other:
//   gathers:  pre_forward gathers what changed (stages 1-2: every unit whose shard was stepped;
//             stage 3: the root unit), then each unit as its forward runs (the next one
//             prefetched), then in backward the units freed after forward, in reverse forward
//             order, each when its backward starts (and the next one prefetched);
//   reduces:  units in reduce order (stages 1-2: bucket order; stage 3: reverse forward order,
//             the root last), each once all its gradients arrived and every earlier one went.
// Whatever a rank's graph does not reach (unused parameters, a unit whose backward never runs)
// is completed at the end of its backward, in the same order, so ranks whose graphs differ still
// issue identical collectives, only later.
#pragma once

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/sharded_data_parallel.h>
#include <tandem/runtime/step_scope.h>

#include "runtime/data_parallel/backward_pass.h"
#include "runtime/data_parallel/grad_ready.h"
#include "runtime/sharded/flat_unit.h"

#include <torch/csrc/autograd/function.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem {

struct ShardedDataParallelCore::State : detail::UnitHooks,
                                        detail::GradReadyListener,
                                        detail::StepParticipant,
                                        std::enable_shared_from_this<ShardedDataParallelCore::State> {
  // finalize() waits for async checkpoint copies, so saves may defer them (checkpoint_manager.h).
  CheckpointStagingFence staging_fence;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<DeviceMesh> mesh;        // where the communicators below come from
  std::shared_ptr<Communicator> world;     // the data-parallel ranks (dp_replicate x dp_shard)
  std::shared_ptr<Communicator> shard_comm;      // the ranks a shard spans: gathers
  std::shared_ptr<Communicator> reduce_comm;     // the same ranks: reduce-scatters
  std::shared_ptr<Communicator> replicate_comm;  // hybrid: same shard index on other groups
  ShardingOptions options;
  ShardingPolicy shards;                   // what options.stage shards
  BucketCaps caps;                         // stages 0-2: units are buckets of these sizes
  DistributedDataParallelOptions ddp;
  at::ScalarType wire_dtype = at::kFloat;  // reduce_dtype, or the codec's cast (fp16/bf16)
  MixedPrecisionOptions mixed;             // ddp.mixed_precision: low-precision parameters

  std::vector<at::Tensor> params;  // trainable parameters, registration order
  std::vector<std::string> names;
  std::vector<int> unit_of;        // param -> unit
  std::vector<detail::FlatUnit> units;
  int root = -1;                   // stage 3: the unit of parameters in no ShardedUnit (or -1)
  std::vector<at::Tensor> frozen;  // parameters not requiring grad: replicated, broadcast once
  std::vector<at::Tensor> buffers;
  std::vector<std::string> buffer_names;
  detail::GradAccumulators accumulators;  // the grad-ready hooks

  mutable std::mutex mutex;
  detail::BackwardPass backward{"ShardedDataParallel"};  // mode, finalize callback, misuse checks
  bool sync = true;
  bool join_active = false;        // a Join lives: each training forward notifies it
  int64_t step = 0;
  std::vector<int> forward_order;       // stage 3: units in the order their forward ran
  std::vector<int> last_forward_order;  // of the previous step (prefetch plan)
  bool order_checked = false;
  std::vector<int> reduce_order;         // this backward's reduce order
  size_t reduce_next = 0;
  size_t reduce_finished = 0;            // stages 2-3: reduce_order[0, this) are finished
  std::vector<int> backward_gathers;     // stage 3: units to gather again, in backward order
  size_t backward_gathered = 0;
  std::vector<char> arrived;             // param -> its gradient arrived in this backward
  std::vector<int64_t> param_versions;  // after the last gather: detects stray optimizers
  std::chrono::steady_clock::time_point first_reduce;
  double overlap_seconds = 0;
  double gather_wait_seconds = 0;  // this step's time blocked in wait_gathered
  double reduce_wait_seconds = 0;  // the last backward's time blocked on reduce-scatters

  // runtime/sharded/sharded_recovery.cpp
  // Takes the world and the shard-group communicators from `mesh` (its dp_* dimensions).
  void connect(std::shared_ptr<DeviceMesh> mesh);
  // An aborted fault-tolerant step (step_scope.h): waits out its failed collectives and forgets
  // its gradients, so the next forward starts as after a dropped backward.
  void drop_step() override;

  // runtime/sharded/sharded_layout.cpp
  void build_units();
  void lay_out(detail::FlatUnit& u);
  // Mixed precision, after the initial broadcast: the fp32 values become the shard (master) and
  // the flat buffer under the parameters is cast to param_dtype.
  void lower_precision(detail::FlatUnit& u);
  // Where a unit's averaged gradient slice lands: a slice of grad_flat (stage 1 when its dtype is
  // the shard's) or grad_shard (allocated here when needed).
  at::Tensor reduce_output(detail::FlatUnit& u);
  void verify_same_everywhere();

  // runtime/sharded/sharded_gather.cpp
  void gather(int unit, bool prefetch);  // issues the all-gather of `unit` (no-op if current)
  void wait_gathered(int unit);
  void release(int unit);                // stage 3: frees the unit's full parameters
  bool resharded(int unit) const;        // stage 3 frees `unit` after its forward
  void before_forward(int unit) override;
  std::vector<at::Tensor> after_forward(int unit, std::vector<at::Tensor> outputs) override;
  void pre_backward(int unit);
  void want_for_backward(int unit);       // pre_backward under the lock (also recomputes)
  void check_parameter_versions();

  // runtime/sharded/sharded_export.cpp: calls `fn(name, full tensor)` for every parameter and
  // buffer, one unit's full parameters in memory at a time (collective: every rank calls it).
  void for_each_full_tensor(const std::function<void(const std::string&, const at::Tensor&)>& fn);

  // runtime/sharded/sharded_reduce.cpp
  void arm_backward(const std::vector<at::Tensor>& outputs);
  void on_grad_ready(int64_t param) override;
  void mark_ready(int unit);
  void advance_reduces();
  void reduce(int unit);
  void finalize();
  void finish_reduce(int unit);
  // Issues backward_gathers[backward_gathered, upto); `current` is the unit that needs its own.
  void gather_for_backward(size_t upto, int current);
  // Whether stage 3 prefetches in backward at `when` ("pre" or "post", sharding.backward_prefetch).
  bool prefetch_in_backward(const char* when) const;

  int shard_rank() const { return shard_comm->rank(); }
  int shard_size() const { return shard_comm->size(); }
};

}  // namespace tandem
