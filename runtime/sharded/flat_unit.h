// Internal: one unit of ShardedDataParallel - parameters laid out in order in a flat buffer, each
// as aligned as a tensor of its own (bucket_plan.h's flat_layout), that is split evenly over the
// shard group - and the storage tricks that let stage 3 free and
// re-create that buffer under the parameters without changing their identity.
#pragma once

#include <tandem/collectives/communicator.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::detail {

struct FlatUnit {
  std::string name;             // "block3", "bucket 2", "(root)"
  std::vector<int64_t> params;  // indices into the model's trainable parameters, in flat order
  std::vector<int64_t> offsets; // element offset of each in the flat buffer
  int64_t numel = 0;            // the end of the last parameter (alignment gaps included)
  int64_t shard_numel = 0;      // S: ceil(numel / group size), rounded up to flat_alignment
                                // elements; the flat buffer holds S * group
  at::TensorOptions options;    // dtype and device of every parameter of the unit (as computed)
  at::TensorOptions master_options;  // of `shard`: float32 under mixed precision, else `options`
  at::TensorOptions grad_options;    // of `grad_flat`: the dtype gradients are reduced in

  at::Tensor flat;   // [S * group] full parameters; the parameters are views of it
  at::Tensor shard;  // [S] leaf requiring grad: what the optimizer steps (a view of `flat` in
                     // stages 1-2, memory of its own in stage 3 and under mixed precision,
                     // where it is the fp32 master)
  bool materialized = true;  // stage 3: whether `flat` has memory now
  c10::Storage tombstone;    // stage 3: what the parameters point at while `flat` is freed (made
                             // at the first free): any read of it throws, naming the unit

  // Gathering (the shard into `flat`).
  WorkPtr gather_work;
  at::Tensor gather_input;       // kept alive until gather_work completed
  int64_t gathered_version = 0;  // shard's version counter when `flat` was last made current
  bool gather_prefetched = false;
  bool stale = false;  // a synchronised backward ended since the last gather, so the optimizer
                       // may have stepped the shard through .data() (libtorch's SGD does), which
                       // bumps no version counter: gather again
  int64_t gather_begin_us = 0;

  // Gradients of one backward.
  at::Tensor grad_flat;   // [S * group] full gradients (stages 0-1: persistent, the parameters'
                          // .grad are views; stages 2-3: built when the unit is reduced)
  at::Tensor grad_shard;  // [S] this rank's averaged gradient (shard.grad)
  at::Tensor grad_wire;   // the low-precision copy on the wire (sharding.reduce_dtype)
  WorkPtr reduce_work;     // null when the reduction needed no collective (one rank)
  bool reduce_pending = false;  // reduced, and finish_reduce() has not run yet
  int64_t reduce_begin_us = 0;
  int64_t pending = 0;    // parameters whose gradient has not arrived in this backward
  bool ready = false;     // every gradient arrived (or the backward ended)
  bool forward_ran = false;
  bool pre_backward_ran = false;

  int64_t bytes() const { return numel * static_cast<int64_t>(options.dtype().itemsize()); }
  int64_t padded_numel(int group) const { return shard_numel * group; }
  // Zeroes the elements of `flat` (a buffer laid out as this unit's) that hold no parameter: the
  // alignment gaps and the tail. `params`: the model's trainable parameters.
  void zero_padding(const at::Tensor& flat, const std::vector<at::Tensor>& params) const;
};

// Stage 3. free_storage() takes `unit.flat`'s memory away in place and points the unit's
// parameters (`params`: the model's trainable parameters) at its tombstone, so a read between
// steps throws a c10::Error that names the unit and gather_parameters() instead of reading freed
// memory. allocate_storage() gives `flat` fresh memory (from its storage's own allocator) and
// points the parameters back. The StorageImpl under `flat` stays the same object, so what
// autograd saved of the parameters in forward (views over it) sees the new memory in backward.
void allocate_storage(FlatUnit& unit, std::vector<at::Tensor>& params);
void free_storage(FlatUnit& unit, std::vector<at::Tensor>& params);

// `dst` takes `src`'s values through a tensor of its own over the same memory, so the version
// counters of the parameters (checked by autograd for what it saved) are not bumped.
void copy_without_version_bump(const at::Tensor& dst, const at::Tensor& src);

}  // namespace tandem::detail
