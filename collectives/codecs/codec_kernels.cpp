#include "collectives/codecs/codec_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace tandem::kernels {

namespace {

// The magnitude's bits as an unsigned key: for non-negative floats (and NaN, above infinity)
// the integer order of the bits is the numeric order.
inline uint32_t magnitude_key(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

constexpr int kShift = 20;                       // 31-bit key -> 11-bit bucket
constexpr int kBuckets = 1 << (31 - kShift);

}  // namespace

std::vector<int64_t> top_magnitudes(const float* x, int64_t n, int64_t k) {
  std::vector<int64_t> hist(kBuckets, 0);
  for (int64_t i = 0; i < n; ++i) ++hist[magnitude_key(x[i]) >> kShift];
  // The bucket holding the k-th largest key; every key in higher buckets is taken.
  int64_t above = 0;
  int bucket = kBuckets - 1;
  while (above + hist[bucket] < k) above += hist[bucket--];
  const int64_t from_bucket = k - above;

  std::vector<int64_t> taken;
  taken.reserve(static_cast<size_t>(k));
  std::vector<std::pair<uint32_t, int64_t>> candidates;
  candidates.reserve(static_cast<size_t>(hist[bucket]));
  const uint32_t b = static_cast<uint32_t>(bucket);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = magnitude_key(x[i]);
    const uint32_t kb = key >> kShift;
    if (kb > b) {
      taken.push_back(i);
    } else if (kb == b) {
      candidates.emplace_back(key, i);
    }
  }
  // Largest keys first; equal keys by ascending index.
  auto larger = [](const std::pair<uint32_t, int64_t>& a, const std::pair<uint32_t, int64_t>& c) {
    return a.first != c.first ? a.first > c.first : a.second < c.second;
  };
  if (from_bucket < static_cast<int64_t>(candidates.size())) {
    std::nth_element(candidates.begin(), candidates.begin() + from_bucket, candidates.end(), larger);
  }
  for (int64_t i = 0; i < from_bucket; ++i) taken.push_back(candidates[i].second);
  std::sort(taken.begin(), taken.end());
  return taken;
}

void pack_signs(const float* x, int64_t n, uint8_t* bits) {
  const int64_t full = n / 8;
  for (int64_t i = 0; i < full; ++i) {
    const float* v = x + 8 * i;
    uint8_t byte = 0;
    for (int b = 0; b < 8; ++b) byte |= static_cast<uint8_t>(v[b] >= 0) << b;
    bits[i] = byte;
  }
  if (full * 8 < n) {
    uint8_t byte = 0;
    for (int64_t j = full * 8; j < n; ++j) byte |= static_cast<uint8_t>(x[j] >= 0) << (j - full * 8);
    bits[full] = byte;
  }
}

double sum_magnitudes(const float* x, int64_t n) {
  // Eight float lanes (vectorised: each lane is its own sum, so no reassociation is needed) over
  // short blocks; the blocks are summed in double. Accurate, and the same bits every run.
  double total = 0;
  constexpr int64_t kBlock = 4096;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = start;
    for (; i + 8 <= end; i += 8) {
      for (int l = 0; l < 8; ++l) lanes[l] += std::fabs(x[i + l]);
    }
    for (; i < end; ++i) lanes[0] += std::fabs(x[i]);
    for (float lane : lanes) total += lane;
  }
  return total;
}

namespace {

// kSigns[byte][b] = +1 or -1 for bit b of `byte`: eight entries per table row, so the loops
// below read a byte, then do eight vectorised multiply-adds.
struct SignTable {
  float row[256][8];
  SignTable() {
    for (int v = 0; v < 256; ++v) {
      for (int b = 0; b < 8; ++b) row[v][b] = (v >> b) & 1 ? 1.0f : -1.0f;
    }
  }
};
const SignTable kSigns;

inline float sign_of(const uint8_t* bits, int64_t i) { return kSigns.row[bits[i >> 3]][i & 7]; }

// out[i] (=, or += with Accumulate) scale * sign i, bits from entry `first`.
template <bool Accumulate>
void apply_signs(float* out, int64_t n, const uint8_t* bits, int64_t first, float scale) {
  int64_t i = 0;
  auto one = [&](int64_t j) {
    const float v = scale * sign_of(bits, first + j);
    if (Accumulate) {
      out[j] += v;
    } else {
      out[j] = v;
    }
  };
  for (; i < n && ((first + i) & 7) != 0; ++i) one(i);  // up to the next whole byte
  for (; i + 8 <= n; i += 8) {
    const float* row = kSigns.row[bits[(first + i) >> 3]];
    float* o = out + i;
    for (int b = 0; b < 8; ++b) {
      if (Accumulate) {
        o[b] += scale * row[b];
      } else {
        o[b] = scale * row[b];
      }
    }
  }
  for (; i < n; ++i) one(i);
}

}  // namespace

void subtract_signs(float* x, int64_t n, const uint8_t* bits, int64_t first, float scale) {
  apply_signs<true>(x, n, bits, first, -scale);
}

void add_signs(float* out, int64_t n, const uint8_t* bits, int64_t first, float scale,
               bool accumulate) {
  if (accumulate) {
    apply_signs<true>(out, n, bits, first, scale);
  } else {
    apply_signs<false>(out, n, bits, first, scale);
  }
}

}  // namespace tandem::kernels
