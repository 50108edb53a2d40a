#include "collectives/tensor_checks.h"

#include "collectives/async_work.h"

#include <tandem/base/errors.h>

namespace tandem::detail {

namespace {

bool supported_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kChar: case at::kByte: case at::kShort: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    default: return c10::toString(dtype);
  }
}

void check_collective_tensor(const at::Tensor& t, const char* op, const char* arg) {
  const std::string where = std::string("tandem: ") + op + ": argument '" + arg + "' ";
  if (!t.defined()) throw CommError(where + "is an undefined tensor; pass an allocated tensor.");
  if (t.layout() != at::kStrided) {
    throw CommError(where + "has a non-strided layout (sparse/mkldnn); convert it with to_dense().");
  }
  if (!supported_dtype(t.scalar_type())) {
    throw CommError(where + "has dtype " + dtype_name(t.scalar_type()) +
                    ", which collectives do not support; use float32/float64/float16/bfloat16 or "
                    "int8/uint8/int16/int32/int64.");
  }
}

void check_tensor(const at::Tensor& t, const char* op, const char* arg, c10::DeviceType device,
                  const char* backend) {
  check_collective_tensor(t, op, arg);
  if (t.device().type() != device) {
    throw CommError(std::string("tandem: ") + op + ": argument '" + arg + "' is on " +
                    t.device().str() + " but the " + backend + " communicator works on " +
                    c10::DeviceTypeName(device) +
                    " tensors; move the tensor or use the matching backend.");
  }
}

void check_reduce_op(const at::Tensor& t, ReduceOp reduce, const char* op) {
  if (reduce == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type())) {
    throw CommError(std::string("tandem: ") + op + ": 'avg' on an integer tensor (" +
                    dtype_name(t.scalar_type()) +
                    ") would truncate; reduce with 'sum' and divide, or use a floating dtype.");
  }
}

void check_scaled_numel(const at::Tensor& big, const char* big_name, const at::Tensor& small,
                        const char* small_name, int64_t factor, const char* op) {
  if (big.scalar_type() != small.scalar_type()) {
    throw CommError(std::string("tandem: ") + op + ": '" + big_name + "' is " +
                    dtype_name(big.scalar_type()) + " but '" + small_name + "' is " +
                    dtype_name(small.scalar_type()) + "; both must have the same dtype.");
  }
  if (big.numel() != factor * small.numel()) {
    throw CommError(std::string("tandem: ") + op + ": '" + big_name + "' has " +
                    std::to_string(big.numel()) + " elements but must have world size (" +
                    std::to_string(factor) + ") x " + std::to_string(small.numel()) + " = " +
                    std::to_string(factor * small.numel()) + " (the elements of '" + small_name +
                    "').");
  }
}

void check_peer(int peer, int size, const char* op, const char* arg) {
  if (peer < 0 || peer >= size) {
    throw CommError(std::string("tandem: ") + op + ": " + arg + " " + std::to_string(peer) +
                    " is out of range; valid ranks are 0.." + std::to_string(size - 1) + ".");
  }
}

std::string tensor_summary(const at::Tensor& t) {
  return format_bytes(static_cast<uint64_t>(t.numel()) * t.element_size()) + " " +
         dtype_name(t.scalar_type());
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s + "]";
}

}  // namespace tandem::detail
