// The x86 variants of cast_kernels.h, each function compiled for its instruction set with
// __attribute__((target)) so the library itself still runs on any x86-64; cast_kernels.cpp calls
// them only where the CPU has the instructions.
#include "collectives/kernels/cast_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// mistakes for a read of an uninitialised value (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define TANDEM_AVX2 __attribute__((target("avx2,f16c")))
#define TANDEM_AVX512 __attribute__((target("avx2,f16c,avx512f")))
#define TANDEM_AVX512BF16 __attribute__((target("avx2,f16c,avx512f,avx512bf16")))

namespace tandem::kernels {

namespace {

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// Lanes `x` (after the division) the portable way: for the rare vectors the instruction rounds
// otherwise than c10 (NaN payloads, bfloat16 subnormals).
template <uint16_t (*Round)(float), int Lanes>
void redo(const float* x, uint16_t* out) {
  for (int l = 0; l < Lanes; ++l) out[l] = Round(x[l]);
}

template <uint16_t (*Round)(float)>
void tail(const float* in, uint16_t* out, size_t n, const Divisor& d) {
  for (size_t i = 0; i < n; ++i) out[i] = Round(d.multiply ? in[i] * d.value : in[i] / d.value);
}

// ---- AVX2 + F16C: 8 lanes --------------------------------------------------------------------

TANDEM_AVX2 inline __m256 scale8(__m256 x, const Divisor& d, __m256 v) {
  return d.multiply ? _mm256_mul_ps(x, v) : _mm256_div_ps(x, v);
}

TANDEM_AVX2 inline __m256i bf16_round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
}

TANDEM_AVX2 void to_half_avx2(const float* in, uint16_t* out, size_t n, float divisor) {
  const Divisor d(divisor);
  const __m256 v = _mm256_set1_ps(d.value);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = scale8(_mm256_loadu_ps(in + i), d, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(x, kRound));
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, x);
      redo<half_bits, 8>(lanes, out + i);
    }
  }
  tail<half_bits>(in + i, out + i, n - i, d);
}

TANDEM_AVX2 void to_bf16_avx2(const float* in, uint16_t* out, size_t n, float divisor) {
  const Divisor d(divisor);
  const __m256 v = _mm256_set1_ps(d.value);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i r = bf16_round8(scale8(_mm256_loadu_ps(in + i), d, v));
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  tail<bf16_bits>(in + i, out + i, n - i, d);
}

TANDEM_AVX2 void from_half_avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) _mm_store_ss(out + i, _mm_cvtph_ps(_mm_cvtsi32_si128(in[i])));
}

TANDEM_AVX2 void from_bf16_avx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) {
    const uint32_t w = static_cast<uint32_t>(in[i]) << 16;
    __builtin_memcpy(out + i, &w, sizeof w);
  }
}

// ---- AVX-512F: 16 lanes ----------------------------------------------------------------------

TANDEM_AVX512 inline __m512 scale16(__m512 x, const Divisor& d, __m512 v) {
  return d.multiply ? _mm512_mul_ps(x, v) : _mm512_div_ps(x, v);
}

TANDEM_AVX512 void to_half_avx512(const float* in, uint16_t* out, size_t n, float divisor) {
  const Divisor d(divisor);
  const __m512 v = _mm512_set1_ps(d.value);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = scale16(_mm512_loadu_ps(in + i), d, v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtps_ph(x, kRound));
    if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, x);
      redo<half_bits, 16>(lanes, out + i);
    }
  }
  to_half_avx2(in + i, out + i, n - i, divisor);
}

TANDEM_AVX512 void to_bf16_avx512(const float* in, uint16_t* out, size_t n, float divisor) {
  const Divisor d(divisor);
  const __m512 v = _mm512_set1_ps(d.value);
  const __m512i one = _mm512_set1_epi32(1), half_ulp = _mm512_set1_epi32(0x7fff);
  const __m512i nan_bits = _mm512_set1_epi32(0x7fc0);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = scale16(_mm512_loadu_ps(in + i), d, v);
    const __m512i u = _mm512_castps_si512(x);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), one), half_ulp);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, nan_bits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
  }
  to_bf16_avx2(in + i, out + i, n - i, divisor);
}

TANDEM_AVX512 void from_half_avx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(h));
  }
  from_half_avx2(in + i, out + i, n - i);
}

TANDEM_AVX512 void from_bf16_avx512(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(w));
  }
  from_bf16_avx2(in + i, out + i, n - i);
}

// ---- AVX-512 BF16: vcvtneps2bf16 -------------------------------------------------------------

TANDEM_AVX512BF16 void to_bf16_avx512bf16(const float* in, uint16_t* out, size_t n,
                                          float divisor) {
  const Divisor d(divisor);
  const __m512 v = _mm512_set1_ps(d.value);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i subnormal_span = _mm512_set1_epi32(0x007fffff), inf = _mm512_set1_epi32(0x7f800000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = scale16(_mm512_loadu_ps(in + i), d, v);
    const __m256bh b = _mm512_cvtneps_pbh(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)b);
    // The instruction flushes subnormals (|bits| in [1, 0x7fffff]) and keeps NaN payloads.
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), abs_mask);
    const __mmask16 odd = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, one), subnormal_span) |
                          _mm512_cmpgt_epu32_mask(a, inf);
    if (odd != 0) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, x);
      redo<bf16_bits, 16>(lanes, out + i);
    }
  }
  to_bf16_avx2(in + i, out + i, n - i, divisor);
}

const CastKernels kAvx2 = {&to_half_avx2, &to_bf16_avx2, &from_half_avx2, &from_bf16_avx2};
const CastKernels kAvx512 = {&to_half_avx512, &to_bf16_avx512, &from_half_avx512,
                             &from_bf16_avx512};
const CastKernels kAvx512Bf16 = {&to_half_avx512, &to_bf16_avx512bf16, &from_half_avx512,
                                 &from_bf16_avx512};

}  // namespace

const CastKernels* x86_cast_kernels(Isa isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
  switch (isa) {
    case Isa::kAvx2: return avx2 ? &kAvx2 : nullptr;
    case Isa::kAvx512: return avx512 ? &kAvx512 : nullptr;
    case Isa::kAvx512Bf16: return avx512 && __builtin_cpu_supports("avx512bf16") ? &kAvx512Bf16 : nullptr;
    case Isa::kPortable: break;
  }
  return nullptr;
}

}  // namespace tandem::kernels

#else  // not x86-64 with GCC or Clang: only the portable variant

namespace tandem::kernels {
const CastKernels* x86_cast_kernels(Isa) { return nullptr; }
}  // namespace tandem::kernels

#endif
