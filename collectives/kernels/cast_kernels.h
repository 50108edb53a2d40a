// Internal: float32 <-> float16 / bfloat16 conversion of contiguous arrays, the inner loops of the
// fp16/bf16 gradient codecs (the cast before and after the all-reduce) and of the half-precision
// reductions (reduce_kernels.cpp converts every element to float and back).
//
// Every variant gives the bits c10::Half / c10::BFloat16 give (ATen's .to(kHalf)): round to
// nearest even, overflow to infinity, subnormals kept, NaN made canonical (float16: sign | 0x7E00;
// bfloat16: 0x7FC0). Widening is exact.
//
// Variants, picked at run time for this CPU (best_isa(); the build targets plain x86-64):
//   portable    c10's bit-manipulation code in plain loops (the compiler's SSE2 at best)
//   avx2        F16C for float16 (8 lanes); bfloat16 rounded with AVX2 integer operations
//   avx512      AVX-512F: vcvtps2ph / vcvtph2ps (16 lanes); bfloat16 with integer operations
//   avx512bf16  avx512, with bfloat16 rounded by vcvtneps2bf16 (it flushes subnormals and keeps
//               NaN payloads: vectors holding such lanes are redone the portable way)
// The vector variants redo a vector holding a NaN the portable way too (F16C keeps payloads).
// Thread-safety: pure functions. No errors: `n` may be 0; inputs and outputs must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

enum class Isa { kPortable, kAvx2, kAvx512, kAvx512Bf16 };
constexpr Isa kAllIsas[] = {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};

const char* isa_name(Isa isa);
// Whether this CPU and build can run `isa`; kPortable always.
bool isa_supported(Isa isa);
// The fastest supported variant, found once.
Isa best_isa();

struct CastKernels {
  // out[i] = (in[i] / divisor) in float, rounded once to float16 / bfloat16 bits: what
  // (t / divisor).to(kHalf) gives. divisor > 0; 1 is a plain cast.
  void (*to_half)(const float* in, uint16_t* out, size_t n, float divisor);
  void (*to_bf16)(const float* in, uint16_t* out, size_t n, float divisor);
  // out[i] = in[i] widened to float.
  void (*from_half)(const uint16_t* in, float* out, size_t n);
  void (*from_bf16)(const uint16_t* in, float* out, size_t n);
};

// The variant's kernels; `isa` must be supported.
const CastKernels& cast_kernels(Isa isa);
// best_isa()'s kernels.
const CastKernels& cast_kernels();

// One element, the portable way (the reference the vector variants fall back to).
uint16_t half_bits(float x);
uint16_t bf16_bits(float x);

// x / divisor as every variant computes it: a product with the exact reciprocal when divisor
// is a power of two (the same bits, cheaper), a quotient otherwise.
struct Divisor {
  explicit Divisor(float divisor);
  bool multiply;
  float value;  // the reciprocal when `multiply`, else the divisor
};

}  // namespace tandem::kernels
