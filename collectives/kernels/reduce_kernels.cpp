#include "collectives/kernels/reduce_kernels.h"

#include "collectives/kernels/cast_kernels.h"

#include <tandem/base/errors.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

namespace tandem::detail {

namespace {

struct Sum { template <class T> static T apply(T a, T b) { return a + b; } };
struct Prod { template <class T> static T apply(T a, T b) { return a * b; } };
struct Min { template <class T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <class T> static T apply(T a, T b) { return std::max(a, b); } };

// out = a (op) b element-wise, in T itself.
template <class T, class Op>
struct Kernel {
  static void run(void* out, const void* a, const void* b, size_t n) {
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
  }
};

// float16 / bfloat16: blocks widened to float with the CPU's vector conversions, combined in
// float, rounded once: the bits of element-wise c10::Half arithmetic, without its scalar
// conversions (measured by scripts/bench-compression).
template <bool Bf16, class Op>
void low_precision(void* out, const void* a, const void* b, size_t n) {
  constexpr size_t kBlock = 512;
  const kernels::CastKernels& k = kernels::cast_kernels();
  const auto widen = Bf16 ? k.from_bf16 : k.from_half;
  const auto narrow = Bf16 ? k.to_bf16 : k.to_half;
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  alignas(64) float fx[kBlock];
  alignas(64) float fy[kBlock];
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t m = std::min(kBlock, n - start);
    widen(x + start, fx, m);
    widen(y + start, fy, m);
    for (size_t i = 0; i < m; ++i) fx[i] = Op::apply(fx[i], fy[i]);
    narrow(fx, o + start, m, 1.0f);
  }
}
template <class Op>
struct Kernel<c10::Half, Op> {
  static void run(void* out, const void* a, const void* b, size_t n) {
    low_precision<false, Op>(out, a, b, n);
  }
};
template <class Op>
struct Kernel<c10::BFloat16, Op> {
  static void run(void* out, const void* a, const void* b, size_t n) {
    low_precision<true, Op>(out, a, b, n);
  }
};

template <class T>
ReduceFn for_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &Kernel<T, Sum>::run;
    case ReduceOp::kProduct: return &Kernel<T, Prod>::run;
    case ReduceOp::kMin: return &Kernel<T, Min>::run;
    case ReduceOp::kMax: return &Kernel<T, Max>::run;
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

}  // namespace tandem::detail
