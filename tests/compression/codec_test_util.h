// Shared by the codec tests (codec_test.cpp, step_undo_test.cpp): hand-made buckets of fresh
// parameters, deterministic per-rank gradients, and a loop that runs a codec on ranks as threads.
#pragma once

#include "tests/support/test_support.h"

#include <tandem/collectives/grad_codec.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

namespace tandem {
namespace {

using testing::run_ranks;

// A bucket of fresh parameters 0..n-1 with the given shapes, holding `values` (flat).
GradBucket make_bucket(const std::vector<std::vector<int64_t>>& shapes, at::Tensor values,
                       int64_t step = 0) {
  GradBucket b;
  b.buffer = values.contiguous().clone();
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    b.param_indices.push_back(static_cast<int64_t>(i));
    b.offsets.push_back(offset);
    b.shapes.push_back(shapes[i]);
    int64_t numel = 1;
    for (int64_t d : shapes[i]) numel *= d;
    offset += numel;
  }
  EXPECT_EQ(offset, values.numel());
  b.step = step;
  return b;
}

int64_t numel_of(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t n = 0;
  for (const auto& s : shapes) {
    int64_t k = 1;
    for (int64_t d : s) k *= d;
    n += k;
  }
  return n;
}

// Rank r's gradient at `step`: deterministic, different per rank and step.
at::Tensor grad_of(int rank, int64_t step, int64_t n, at::ScalarType dtype = at::kFloat) {
  at::Generator gen = at::detail::createCPUGenerator(1000 + 31 * rank + step);
  return at::randn({n}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

// Runs `steps` steps of `codec_of(rank)` on `world` ranks; returns, per rank, each step's decoded
// bucket, and leaves every rank's codec in `codecs`.
struct CodecRun {
  std::vector<std::vector<at::Tensor>> decoded;            // [rank][step]
  std::vector<std::shared_ptr<GradCodec>> codecs;          // [rank]
};
[[maybe_unused]]
CodecRun run_codec(int world, int steps, const std::vector<std::vector<int64_t>>& shapes,
              const std::function<std::shared_ptr<GradCodec>()>& make,
              at::ScalarType dtype = at::kFloat, GlooOptions options = {}) {
  CodecRun run;
  run.decoded.resize(world);
  run.codecs.resize(world);
  const int64_t n = numel_of(shapes);
  run_ranks(world, [&](Communicator& comm) {
    auto codec = make();
    for (int step = 0; step < steps; ++step) {
      GradBucket b = make_bucket(shapes, grad_of(comm.rank(), step, n, dtype), step);
      codec->reduce(comm, b)->wait();
      run.decoded[comm.rank()].push_back(b.buffer.clone());
    }
    run.codecs[comm.rank()] = codec;
  }, options);
  return run;
}

[[maybe_unused]]
at::Tensor average_of(int world, int64_t step, int64_t n) {
  at::Tensor sum = at::zeros({n});
  for (int r = 0; r < world; ++r) sum += grad_of(r, step, n);
  return sum / world;
}

[[maybe_unused]]
void expect_same_bits_on_every_rank(const CodecRun& run) {
  for (size_t r = 1; r < run.decoded.size(); ++r) {
    for (size_t s = 0; s < run.decoded[r].size(); ++s) {
      EXPECT_TRUE(at::equal(run.decoded[r][s], run.decoded[0][s]))
          << "rank " << r << " step " << s << " decoded other bits than rank 0";
    }
  }
}

const std::vector<std::vector<int64_t>> kShapes = {{32, 24}, {24}, {16, 3, 4}, {5}};

}  // namespace
}  // namespace tandem
