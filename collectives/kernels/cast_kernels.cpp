#include "collectives/kernels/cast_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdlib>

namespace tandem::kernels {

// cast_kernels_x86.cpp: the variant's table, or null where this build has none.
const CastKernels* x86_cast_kernels(Isa isa);

uint16_t half_bits(float x) { return c10::detail::fp16_ieee_from_fp32_value(x); }
uint16_t bf16_bits(float x) { return c10::detail::round_to_nearest_even(x); }

Divisor::Divisor(float divisor) {
  int exponent = 0;
  multiply = std::frexp(divisor, &exponent) == 0.5f && exponent > -125 && exponent < 127;
  value = multiply ? 1.0f / divisor : divisor;
}

namespace {

template <uint16_t (*Round)(float)>
void narrow(const float* in, uint16_t* out, size_t n, float divisor) {
  const Divisor d(divisor);
  if (d.multiply) {
    for (size_t i = 0; i < n; ++i) out[i] = Round(in[i] * d.value);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = Round(in[i] / d.value);
  }
}

void from_half(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = c10::detail::fp16_ieee_to_fp32_value(in[i]);
}

void from_bf16(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = c10::detail::f32_from_bits(in[i]);
}

const CastKernels kPortable = {&narrow<half_bits>, &narrow<bf16_bits>, &from_half, &from_bf16};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  return isa == Isa::kPortable || x86_cast_kernels(isa) != nullptr;
}

Isa best_isa() {
  static const Isa best = [] {
    for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2}) {
      if (isa_supported(isa)) return isa;
    }
    return Isa::kPortable;
  }();
  return best;
}

const CastKernels& cast_kernels(Isa isa) {
  if (isa == Isa::kPortable) return kPortable;
  const CastKernels* k = x86_cast_kernels(isa);
  if (k == nullptr) std::abort();  // a caller that did not ask isa_supported(): a bug
  return *k;
}

const CastKernels& cast_kernels() {
  static const CastKernels& best = cast_kernels(best_isa());
  return best;
}

}  // namespace tandem::kernels
