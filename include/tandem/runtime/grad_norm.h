// Global gradient-norm clipping: the norm over every gradient of every rank that holds a different
// part of the model (the shards of ShardedDataParallel, the stages of a pipeline), as one model's.
//
//   double norm = tandem::clip_grad_norm(opt_params, 1.0, 2.0, pipeline_group);
//
// Each rank takes the norm of each of its gradients in one fused pass per device and dtype
// (ATen's _foreach_norm, accumulating in float32 as torch.nn.utils.clip_grad_norm_ does; no copy
// of a gradient), sums their |g|^p in float64, one all-reduce (sum, or max for the inf norm) over
// `group` combines the ranks, and every rank scales its gradients by max_norm / (norm + 1e-6)
// when that is below 1 (torch.nn.utils.clip_grad_norm_'s rule), again fused. The host reads the
// norm once, for the return value. `group` holds the ranks
// whose gradients are disjoint parts of the model; replicas of the same part (data-parallel
// copies, hybrid-sharding groups) must not be in it twice. Null: this process's gradients only
// (DistributedDataParallel, whose gradients are already averaged and identical on every rank).
// A non-finite norm (an fp16 overflow) leaves the gradients untouched and is returned as it is:
// GradScaler then skips the step, so nothing infinite reaches the weights.
// Ownership: borrows the tensors and the communicator. Thread-safety: one training thread.
// Errors: ConfigError for norm_type other than a positive number or inf, or max_norm <= 0;
// CommError/TimeoutError from the all-reduce (collective: every rank of `group` calls it).
#pragma once

#include <tandem/collectives/communicator.h>

#include <ATen/core/Tensor.h>

#include <vector>

namespace tandem {

// Returns the global norm (before clipping). Parameters without a gradient are skipped.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                      double norm_type = 2.0, Communicator* group = nullptr);

// The same norm without clipping.
double global_grad_norm(const std::vector<at::Tensor>& parameters, double norm_type = 2.0,
                        Communicator* group = nullptr);

// clip_grad_norm() over gradient tensors given directly, each scaled in place (views included:
// ShardedDataParallel passes each parameter's slice of its shards' gradients, in the model's
// parameter order, so that at world 1 the norm has the bits of the plain model's). Undefined and
// empty tensors are skipped.
double clip_gradients(const std::vector<at::Tensor>& gradients, double max_norm,
                      double norm_type = 2.0, Communicator* group = nullptr);

}  // namespace tandem
