#include "collectives/reduce_kernels.h"

#include <tandem/base/errors.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

namespace tandem {

namespace {

struct Sum { template <class T> static T apply(T a, T b) { return a + b; } };
struct Prod { template <class T> static T apply(T a, T b) { return a * b; } };
struct Min { template <class T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <class T> static T apply(T a, T b) { return std::max(a, b); } };

// The compute type: float for the 16-bit floats, the type itself otherwise.
template <class T> struct Compute { using type = T; };
template <> struct Compute<c10::Half> { using type = float; };
template <> struct Compute<c10::BFloat16> { using type = float; };

template <class T, class Op>
void kernel(void* out, const void* a, const void* b, size_t n) {
  using C = typename Compute<T>::type;
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = static_cast<T>(Op::apply(static_cast<C>(x[i]), static_cast<C>(y[i])));
  }
}

template <class T>
ReduceFn for_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &kernel<T, Sum>;
    case ReduceOp::kProduct: return &kernel<T, Prod>;
    case ReduceOp::kMin: return &kernel<T, Min>;
    case ReduceOp::kMax: return &kernel<T, Max>;
  }
  return nullptr;
}

}  // namespace

ReduceFn reduce_kernel(at::ScalarType dtype, ReduceOp op) {
  switch (dtype) {
    case at::kFloat: return for_op<float>(op);
    case at::kDouble: return for_op<double>(op);
    case at::kHalf: return for_op<c10::Half>(op);
    case at::kBFloat16: return for_op<c10::BFloat16>(op);
    case at::kChar: return for_op<int8_t>(op);
    case at::kByte: return for_op<uint8_t>(op);
    case at::kShort: return for_op<int16_t>(op);
    case at::kInt: return for_op<int32_t>(op);
    case at::kLong: return for_op<int64_t>(op);
    default:
      throw CommError(std::string("tandem: no reduction kernel for dtype ") +
                      c10::toString(dtype));
  }
}

}  // namespace tandem
