// Internal (libtandem_cuda): NCCL's names for tandem's dtypes and reductions.
#pragma once

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>

#include "collectives/tensor_checks.h"

#include <nccl.h>

#include <string>

namespace tandem::detail {

// Throws CommError naming `op` for a dtype NCCL lacks (int16, bool, complex).
inline ncclDataType_t nccl_type(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default:
      throw CommError(std::string("tandem: ") + op + ": NCCL does not support dtype " +
                      dtype_name(t.scalar_type()) + "; cast to int32 or a float type.");
  }
}

inline ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;
}

}  // namespace tandem::detail
