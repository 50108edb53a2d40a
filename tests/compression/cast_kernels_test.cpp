// The float16 / bfloat16 conversions behind the cast codecs and the half-precision reductions
// (collectives/kernels/cast_kernels.h, reduce_kernels.h): every variant this CPU can run, the
// portable one included, gives c10::Half / c10::BFloat16's bits, for a stratified sweep of every
// float exponent and the bit patterns around each rounding boundary, NaN, infinities, subnormals,
// overflow, with and without a divisor, at unaligned starts and odd lengths; widening is checked
// exhaustively.
#include "tests/support/test_support.h"

#include "collectives/kernels/cast_kernels.h"
#include "collectives/kernels/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace tandem {
namespace {

using detail::reduce_kernel;
using kernels::Isa;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Every upper half-word (sign, exponent, top 7 mantissa bits) with low half-words that sit on,
// next to and between the rounding boundaries of float16 (13 dropped bits) and bfloat16 (16).
std::vector<float> sweep() {
  std::vector<float> v;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                           0x7fff, 0x8000, 0x8001, 0xefff, 0xf000, 0xffff};
  std::mt19937 gen(7);
  for (uint32_t hi = 0; hi <= 0xffff; ++hi) {
    for (uint32_t lo : lows) v.push_back(from_bits(hi << 16 | lo));
    v.push_back(from_bits(hi << 16 | (gen() & 0xffff)));
  }
  for (float x : {65504.0f, 65519.99f, 65520.0f, 1e9f, 5.960464477539063e-08f, 2.98e-08f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

std::vector<Isa> supported() {
  std::vector<Isa> isas;
  for (Isa isa : kernels::kAllIsas) {
    if (kernels::isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

// First mismatches as text, or "" when all match.
template <class Want>
std::string mismatches(const std::vector<float>& in, const std::vector<uint16_t>& got, Want want) {
  std::string text;
  int shown = 0;
  for (size_t i = 0; i < in.size() && shown < 5; ++i) {
    if (got[i] == want(in[i])) continue;
    char line[128];
    std::snprintf(line, sizeof line, "\n  input 0x%08x: got 0x%04x, want 0x%04x", to_bits(in[i]),
                  got[i], want(in[i]));
    text += line;
    ++shown;
  }
  return text;
}

TEST(CastKernels, EveryVariantRoundsLikeC10WithAndWithoutADivisor) {
  const std::vector<float> in = sweep();
  for (Isa isa : supported()) {
    const kernels::CastKernels& k = kernels::cast_kernels(isa);
    for (float divisor : {1.0f, 2.0f, 3.0f, 8.0f}) {
      SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " divisor " + std::to_string(divisor));
      std::vector<uint16_t> half(in.size()), bf16(in.size());
      k.to_half(in.data(), half.data(), in.size(), divisor);
      k.to_bf16(in.data(), bf16.data(), in.size(), divisor);
      EXPECT_EQ(mismatches(in, half, [&](float x) { return c10::Half(x / divisor).x; }), "");
      EXPECT_EQ(mismatches(in, bf16, [&](float x) { return c10::BFloat16(x / divisor).x; }), "");
    }
  }
}

TEST(CastKernels, UnalignedStartsAndOddLengthsTakeTheSameRounding) {
  std::vector<float> in(1000);
  std::mt19937 gen(3);
  for (float& x : in) x = from_bits(gen());  // any bits: NaNs, infinities, subnormals
  for (Isa isa : supported()) {
    const kernels::CastKernels& k = kernels::cast_kernels(isa);
    for (size_t start : {0, 1, 3, 7}) {
      for (size_t n : {0, 1, 7, 15, 17, 31, 33, 500}) {
        SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " start " + std::to_string(start) +
                     " n " + std::to_string(n));
        std::vector<uint16_t> half(n + 2, 0xabcd), bf16(n + 2, 0xabcd);
        k.to_half(in.data() + start, half.data() + 1, n, 1.0f);
        k.to_bf16(in.data() + start, bf16.data() + 1, n, 1.0f);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(half[i + 1], c10::Half(in[start + i]).x) << i;
          ASSERT_EQ(bf16[i + 1], c10::BFloat16(in[start + i]).x) << i;
        }
        EXPECT_EQ(half[0], 0xabcd);  // nothing written outside [start, start + n)
        EXPECT_EQ(half[n + 1], 0xabcd);
        EXPECT_EQ(bf16[n + 1], 0xabcd);
      }
    }
  }
}

TEST(CastKernels, WideningIsExactForEveryBitPattern) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : supported()) {
    SCOPED_TRACE(kernels::isa_name(isa));
    const kernels::CastKernels& k = kernels::cast_kernels(isa);
    std::vector<float> half(all.size()), bf16(all.size());
    k.from_half(all.data(), half.data(), all.size());
    k.from_bf16(all.data(), bf16.data(), all.size());
    int bad = 0;
    for (size_t i = 0; i < all.size() && bad < 5; ++i) {
      const float want_half = c10::Half(all[i], c10::Half::from_bits());
      const float want_bf16 = c10::BFloat16(all[i], c10::BFloat16::from_bits());
      if (to_bits(half[i]) != to_bits(want_half) || to_bits(bf16[i]) != to_bits(want_bf16)) {
        ADD_FAILURE() << "bits 0x" << std::hex << all[i] << ": float16 gave 0x" << to_bits(half[i])
                      << " (want 0x" << to_bits(want_half) << "), bfloat16 gave 0x"
                      << to_bits(bf16[i]) << " (want 0x" << to_bits(want_bf16) << ")";
        ++bad;
      }
    }
  }
}

TEST(CastKernels, ThePortableVariantIsAlwaysThereAndTheBestIsSupported) {
  EXPECT_TRUE(kernels::isa_supported(Isa::kPortable));
  EXPECT_TRUE(kernels::isa_supported(kernels::best_isa()));
  std::printf("cast kernels on this CPU:");
  for (Isa isa : supported()) std::printf(" %s", kernels::isa_name(isa));
  std::printf(" (best: %s)\n", kernels::isa_name(kernels::best_isa()));
}

// The half-precision reductions of the all-reduce (shared memory and Gloo) give the bits of
// element-wise c10 arithmetic: widen, combine in float, round once.
template <class T>
void expect_reductions_like_c10(at::ScalarType dtype) {
  std::mt19937 gen(11);
  const size_t n = 5000 + 3;  // several blocks and a tail
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t x = static_cast<uint16_t>(gen()), y = static_cast<uint16_t>(gen());
    a[i] = T(x, T::from_bits());
    b[i] = T(i % 7 == 0 ? x : y, T::from_bits());  // some equal pairs: exact doubling
  }
  const std::pair<ReduceOp, float (*)(float, float)> ops[] = {
      {ReduceOp::kSum, [](float x, float y) { return x + y; }},
      {ReduceOp::kProduct, [](float x, float y) { return x * y; }},
      {ReduceOp::kMin, [](float x, float y) { return std::min(x, y); }},
      {ReduceOp::kMax, [](float x, float y) { return std::max(x, y); }}};
  for (const auto& [op, f] : ops) {
    SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + to_string(op));
    std::vector<T> out(n);
    reduce_kernel(dtype, op)(out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const T want(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
      ASSERT_EQ(out[i].x, want.x) << "element " << i << ": " << static_cast<float>(a[i]) << ", "
                                  << static_cast<float>(b[i]);
    }
    reduce_kernel(dtype, op)(a.data(), a.data(), b.data(), n);  // in place, as the ring does
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i].x, out[i].x) << "in place, element " << i;
  }
}

TEST(CastKernels, HalfAndBfloat16ReductionsGiveTheBitsOfElementWiseC10Arithmetic) {
  expect_reductions_like_c10<c10::Half>(at::kHalf);
  expect_reductions_like_c10<c10::BFloat16>(at::kBFloat16);
}

}  // namespace
}  // namespace tandem
