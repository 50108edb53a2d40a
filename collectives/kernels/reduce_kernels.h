// Internal: element-wise reduction kernels for Gloo, which has no bfloat16 type and takes the
// reduction as a function pointer. Half and bfloat16 are computed in float and rounded back.
#pragma once

#include <tandem/collectives/communicator.h>

#include <cstddef>

namespace tandem::detail {

// out[i] = a[i] (op) b[i] for n elements; out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The kernel for `dtype` and `op` (kAvg uses the sum kernel; the caller divides afterwards).
// Throws CommError for an unsupported dtype.
ReduceFn reduce_kernel(at::ScalarType dtype, ReduceOp op);

}  // namespace tandem::detail
