// Internal: single-pass CPU loops for the sparsifying codecs on float32 buckets, built -O3 so they
// vectorise. The generic ATen expressions they replace make a temporary per step (abs, masks,
// unpacked signs) and a full sort-based top-k: 10-40x slower on a 64 MiB bucket (measured by
// scripts/bench-compression). Other dtypes and devices use ATen.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::kernels {

// Indices (ascending) of the k entries of x[0..n) with the largest magnitude; ties at the
// threshold go to the lower index. Radix selection on the magnitude's bits: two passes over x,
// then a partial sort of the entries that share the k-th entry's top 11 bits. NaN counts as
// largest. 0 < k <= n.
std::vector<int64_t> top_magnitudes(const float* x, int64_t n, int64_t k);

// Bit b of bits[i] = (x[8 i + b] >= 0), for n entries (the last byte zero-padded).
void pack_signs(const float* x, int64_t n, uint8_t* bits);

// sum |x[0..n)|, accumulated in double.
double sum_magnitudes(const float* x, int64_t n);

// x[i] -= scale * (sign bit i of `bits`, from entry `first`, ? +1 : -1) for n entries.
void subtract_signs(float* x, int64_t n, const uint8_t* bits, int64_t first, float scale);

// out[i] (=, or += when `accumulate`) scale * (bit ? +1 : -1), bits counted from entry `first`.
void add_signs(float* out, int64_t n, const uint8_t* bits, int64_t first, float scale,
               bool accumulate);

}  // namespace tandem::kernels
