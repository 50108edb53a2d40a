// Bucket planning: which parameters share a gradient bucket, and in which order buckets launch.
//
// What: a bucket holds parameters of one dtype; parameters are taken in `order` (the order in
// which backward is expected to produce their gradients) and a bucket closes once its bytes reach
// the cap (the first bucket of each dtype closes at a smaller cap, so communication starts early
// in backward). DistributedDataParallel's Reducer plans with these functions; so can any other
// wrapper that reduces gradients in buckets (sharded data parallel).
//
// Ownership: pure functions over their arguments; plans are plain values the caller owns.
// Thread-safety: thread-safe (no shared state).
// Layout: flat_layout() places the parameters of one bucket (or sharded unit) in its flat buffer,
// each at an offset as aligned as a tensor of its own would be.
//
// Errors: check_bucket_plan() throws ConfigError saying which bucket or parameter is wrong;
// plan_buckets() throws std::out_of_range when `order` names a parameter `dtypes`/`bytes` lack.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// Buckets as lists of parameter indices, in launch order.
using BucketPlan = std::vector<std::vector<int64_t>>;

// Groups parameter indices (taken in `order`) into buckets of one dtype: a bucket closes once its
// bytes reach the cap (first bucket of each dtype: `first_cap_bytes`). Buckets are ordered by the
// position of their first parameter in `order`. `dtypes[p]` and `bytes[p]` describe parameter p.
BucketPlan plan_buckets(const std::vector<int64_t>& order,
                        const std::vector<at::ScalarType>& dtypes,
                        const std::vector<int64_t>& bytes, int64_t first_cap_bytes,
                        int64_t cap_bytes);

// The byte alignment of a parameter's view in a flat buffer on `device`: what its allocator gives
// a tensor of its own (256 bytes on CUDA, as libtorch's caching allocator; 64 elsewhere, c10's
// CPU alignment). Kernels pick code paths by pointer alignment (cuBLAS, vectorised loads), so a
// wrapped model's views must be as aligned as the plain model's tensors to run the same kernels
// and give the same bits.
int64_t flat_alignment(c10::Device device);

// Element offsets of tensors of `numels` elements of `element_size` bytes laid out in that order
// in one flat buffer on `device`, each rounded up to flat_alignment(device), and the buffer's
// numel in `*total` (the end of the last tensor, not rounded). The gaps hold no tensor: a buffer
// starts zeroed, and whoever rebuilds one zeroes them.
std::vector<int64_t> flat_layout(const std::vector<int64_t>& numels, int64_t element_size,
                                 c10::Device device, int64_t* total);

// The order backward usually produces gradients in: reverse registration, n-1 down to 0.
std::vector<int64_t> reverse_registration_order(int64_t n);

// Checks that `plan` (e.g. read back from a checkpoint) puts every one of the `dtypes.size()`
// parameters in exactly one non-empty bucket whose parameters share a dtype. `names[p]` names
// parameter p in the message. Throws ConfigError otherwise.
void check_bucket_plan(const BucketPlan& plan, const std::vector<at::ScalarType>& dtypes,
                       const std::vector<std::string>& names);

}  // namespace tandem
