// Every codec on hand-made buckets, with 2 (or 3) ranks as threads: the cast codecs' exact
// rounding, PowerSGD's exactness at full rank, top-k's choice of entries, conservation of mass by
// error feedback, identical decoding on every rank, state round trips, traffic accounting and
// the registry's errors.
#include "tests/compression/codec_test_util.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/compression.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

namespace tandem {
namespace {

// ---- cast codecs ------------------------------------------------------------------------------

TEST(CastCodec, Fp16AndBf16AreExactToTheTargetPrecisionOverSharedMemoryAndTcp) {
  GlooOptions tcp;
  tcp.shared_memory = false;
  const int64_t n = numel_of(kShapes);
  for (const auto& [name, dtype] : {std::pair{"fp16", at::kHalf}, std::pair{"bf16", at::kBFloat16}}) {
    // Each rank sends (g / 2) rounded to the wire dtype; the sum is rounded once more.
    auto half_of = [&, dtype = dtype](int rank) { return (grad_of(rank, 0, n) / 2).to(dtype).to(at::kFloat); };
    const at::Tensor want = (half_of(0) + half_of(1)).to(dtype).to(at::kFloat);
    for (const GlooOptions& transport : {GlooOptions{}, tcp}) {
      SCOPED_TRACE(std::string(name) + (transport.shared_memory ? " shm" : " tcp"));
      const CodecRun run =
          run_codec(2, 1, kShapes, [&] { return make_codec(name); }, at::kFloat, transport);
      EXPECT_TRUE(at::equal(run.decoded[0][0], want));
      expect_same_bits_on_every_rank(run);
      EXPECT_EQ(run.codecs[0]->name(), name);
      EXPECT_DOUBLE_EQ(run.codecs[0]->compression_ratio(), 2.0);
    }
  }
}

// A float64 bucket takes the generic ATen path (as CUDA buckets do): each rank's share is
// divided in float64 and rounded once to the wire dtype, as on the kernel path.
TEST(CastCodec, AFloat64BucketTakesTheGenericPathWithTheSameRounding) {
  const int64_t n = numel_of(kShapes);
  for (const auto& [name, dtype] : {std::pair{"fp16", at::kHalf}, std::pair{"bf16", at::kBFloat16}}) {
    SCOPED_TRACE(name);
    auto half_of = [&, dtype = dtype](int rank) {
      return (grad_of(rank, 0, n, at::kDouble) / 2).to(dtype).to(at::kFloat);
    };
    const at::Tensor want = (half_of(0) + half_of(1)).to(dtype).to(at::kDouble);
    const CodecRun run = run_codec(2, 1, kShapes, [&] { return make_codec(name); }, at::kDouble);
    EXPECT_TRUE(at::equal(run.decoded[0][0], want));
    expect_same_bits_on_every_rank(run);
  }
}

TEST(CastCodec, AverageOfValuesNearTheFp16MaximumDoesNotOverflow) {
  run_ranks(2, [](Communicator& comm) {
    auto codec = make_codec("fp16");
    GradBucket b = make_bucket({{4}}, at::full({4}, 60000.0f));  // 2 x 60000 > 65504
    codec->reduce(comm, b)->wait();
    EXPECT_TRUE(at::equal(b.buffer, at::full({4}, 60000.0f))) << b.buffer;
  });
}

// Over shared memory the casts happen on the way into and out of the segment (no wire copy);
// the bits are those of casting, summing in rank order with a rounding after every addition, and
// widening, for 3 ranks (the division is a true quotient) and for values that overflow, vanish
// into subnormals or are not numbers.
TEST(CastCodec, SharedMemoryCastsInFlightWithTheBitsOfCastingFirst) {
  const int64_t n = numel_of(kShapes);
  auto values = [&](int rank) {
    at::Tensor g = grad_of(rank, 0, n);
    const float specials[] = {std::nanf(""), INFINITY, -INFINITY, 2.1e5f, -2.1e5f, 1e-7f, 3e-8f,
                              1e-40f, -1e-39f, 0.0f, -0.0f, 65504.0f * 3};
    for (size_t i = 0; i < std::size(specials); ++i) g[static_cast<int64_t>(i * 7 + rank)] = specials[i];
    return g;
  };
  for (const auto& [name, dtype] : {std::pair{"fp16", at::kHalf}, std::pair{"bf16", at::kBFloat16}}) {
    SCOPED_TRACE(name);
    at::Tensor want = (values(0) / 3).to(dtype);
    for (int r = 1; r < 3; ++r) want = (want.to(at::kFloat) + (values(r) / 3).to(dtype).to(at::kFloat)).to(dtype);
    want = want.to(at::kFloat);
    std::vector<at::Tensor> got(3);
    run_ranks(3, [&, name = name](Communicator& comm) {
      auto codec = make_codec(name);
      GradBucket b = make_bucket(kShapes, values(comm.rank()));
      codec->reduce(comm, b)->wait();
      got[comm.rank()] = b.buffer;
      EXPECT_EQ(codec->bytes_sent_last_step(), static_cast<uint64_t>(n * 2 * 2 * 2 / 3));
    });
    // NaN stays NaN; its bits are c10's (0x7FC0 for bfloat16) where ATen's vector casts of the
    // reference give 0xFFFF, so only NaN-ness is compared there.
    const at::Tensor nan = want.isnan();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(at::equal(got[r].isnan(), nan)) << "rank " << r;
      const at::Tensor bits = got[r].masked_fill(nan, 0).view(at::kInt);
      const at::Tensor want_bits = want.masked_fill(nan, 0).view(at::kInt);
      EXPECT_TRUE(at::equal(bits, want_bits)) << "rank " << r << ": differs at "
          << at::nonzero(bits.ne(want_bits)).flatten().slice(0, 0, 5);
    }
  }
}

// ---- auto ---------------------------------------------------------------------------------------

// min_speedup 0 always casts, 1e30 never does: the verdict is forced, the rest is the real path
// (probe, agreement, then the chosen all-reduce for every bucket).
TEST(AutoCodec, SendsWhatItChoseAndSaysSoOverSharedMemoryAndTcp) {
  GlooOptions tcp;
  tcp.shared_memory = false;
  for (const GlooOptions& transport : {GlooOptions{}, tcp}) {
    for (const auto& [min_speedup, cast] : {std::pair{0.0, true}, std::pair{1e30, false}}) {
      SCOPED_TRACE(std::string(transport.shared_memory ? "shm" : "tcp") + " min_speedup " +
                   std::to_string(min_speedup));
      const auto make = [min_speedup = min_speedup] {
        return make_auto_codec({.wire = at::kHalf, .min_speedup = min_speedup});
      };
      const CodecRun got = run_codec(2, 2, kShapes, make, at::kFloat, transport);
      const CodecRun want = run_codec(2, 2, kShapes, [&] { return make_codec(cast ? "fp16" : "average"); },
                                      at::kFloat, transport);
      for (int s = 0; s < 2; ++s) EXPECT_TRUE(at::equal(got.decoded[0][s], want.decoded[0][s])) << s;
      expect_same_bits_on_every_rank(got);
      EXPECT_EQ(got.codecs[1]->name(), cast ? "auto(fp16)" : "auto(average)");
      // The probe is not gradient traffic.
      EXPECT_EQ(got.codecs[0]->bytes_sent_last_step(), want.codecs[0]->bytes_sent_last_step());
      EXPECT_DOUBLE_EQ(got.codecs[0]->compression_ratio(), cast ? 2.0 : 1.0);
    }
  }
}

// Rank 0's verdict holds everywhere, even where a rank was configured otherwise: ranks that
// disagreed would put different collectives on the wire.
TEST(AutoCodec, EveryRankFollowsRankZerosVerdict) {
  for (const bool rank0_casts : {true, false}) {
    SCOPED_TRACE(rank0_casts ? "rank 0 casts" : "rank 0 does not cast");
    std::vector<std::string> names(2);
    std::vector<at::Tensor> decoded(2);
    run_ranks(2, [&](Communicator& comm) {
      const bool casts = (comm.rank() == 0) == rank0_casts;
      auto codec = make_auto_codec({.min_speedup = casts ? 0.0 : 1e30});
      EXPECT_EQ(codec->name(), "auto");  // undecided until its first bucket
      GradBucket b = make_bucket(kShapes, grad_of(comm.rank(), 0, numel_of(kShapes)));
      codec->reduce(comm, b)->wait();
      names[comm.rank()] = codec->name();
      decoded[comm.rank()] = b.buffer;
    });
    EXPECT_EQ(names[0], rank0_casts ? "auto(bf16)" : "auto(average)");
    EXPECT_EQ(names[1], names[0]);
    EXPECT_TRUE(at::equal(decoded[0], decoded[1]));
  }
}

TEST(AutoCodec, OneRankSendsNothingAndCastsNothing) {
  run_ranks(1, [](Communicator& comm) {
    auto codec = make_codec("auto", {{"min_speedup", "0"}});
    GradBucket b = make_bucket({{3}}, at::tensor({0.1f, 0.2f, 0.3f}));
    codec->reduce(comm, b)->wait();
    EXPECT_EQ(codec->name(), "auto(average)");
    EXPECT_TRUE(at::equal(b.buffer, at::tensor({0.1f, 0.2f, 0.3f})));
  });
}

// ---- PowerSGD ---------------------------------------------------------------------------------

TEST(PowerSgd, RankAtLeastMinDimensionReproducesTheExactAverage) {
  const std::vector<std::vector<int64_t>> shapes = {{6, 40}, {40, 5}, {7}};
  PowerSgdOptions o;
  o.rank = 6;
  o.start_iter = 0;
  o.min_compression_rate = 0;  // compress even where it does not pay, to test the algebra
  const CodecRun run = run_codec(2, 3, shapes, [&] { return make_powersgd_codec(o); });
  // The decoded tensor is P (P^T M), a projection computed in float32 with inner dimensions of at
  // most 40: its error is bounded normwise, about (inner dimension) x u x |M| (Higham, GEMM
  // bounds), not element by element. Measured 2-3.5e-7 (2-3 ulps) under OpenBLAS's SkylakeX,
  // Haswell, Zen and Prescott kernels; the bound below is 2 x (40 + 6) ulps.
  const double bound = 2 * (40 + 6) * 1.1920929e-7;
  for (int step = 0; step < 3; ++step) {
    const at::Tensor want = average_of(2, step, numel_of(shapes));
    const double error = ((run.decoded[0][step] - want).norm() / want.norm()).item<double>();
    EXPECT_LE(error, bound) << "step " << step;
  }
  expect_same_bits_on_every_rank(run);
}

TEST(PowerSgd, LowRankIsAnApproximationDecodedIdenticallyEverywhere) {
  PowerSgdOptions o;
  o.rank = 1;
  o.start_iter = 0;
  const CodecRun run = run_codec(3, 3, kShapes, [&] { return make_powersgd_codec(o); });
  const at::Tensor want = average_of(3, 0, numel_of(kShapes));
  EXPECT_FALSE(at::allclose(run.decoded[0][0], want, 1e-3, 1e-3));
  // The 1-D tensors go uncompressed: exact.
  EXPECT_TRUE(at::allclose(run.decoded[0][0].narrow(0, 32 * 24, 24), want.narrow(0, 32 * 24, 24),
                           1e-6, 1e-7));
  expect_same_bits_on_every_rank(run);
  EXPECT_GT(run.codecs[0]->compression_ratio(), 4.0);
}

TEST(PowerSgd, StartsWithPlainAllReduceUntilStartIter) {
  PowerSgdOptions o;
  o.start_iter = 2;
  const CodecRun run = run_codec(2, 3, kShapes, [&] { return make_powersgd_codec(o); });
  const int64_t n = numel_of(kShapes);
  EXPECT_TRUE(at::allclose(run.decoded[0][0], average_of(2, 0, n), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(run.decoded[0][1], average_of(2, 1, n), 1e-6, 1e-7));
  EXPECT_FALSE(at::allclose(run.decoded[0][2], average_of(2, 2, n), 1e-3, 1e-3));
}

// ---- top-k ------------------------------------------------------------------------------------

TEST(TopK, SendsTheLargestMagnitudesOfEachRank) {
  run_ranks(2, [](Communicator& comm) {
    TopKOptions o;
    o.ratio = 0.3;  // k = ceil(0.3 * 10) = 3
    o.error_feedback = false;
    auto codec = make_topk_codec(o);
    const at::Tensor g = comm.rank() == 0
        ? at::tensor({0.1f, -9.f, 0.2f, 0.3f, 8.f, 0.f, 0.f, -7.f, 0.5f, 0.f})
        : at::tensor({5.f, 0.f, 0.f, 0.f, 0.f, -6.f, 0.f, 0.f, 0.1f, 4.f});
    GradBucket b = make_bucket({{10}}, g);
    codec->reduce(comm, b)->wait();
    const at::Tensor want =
        at::tensor({5.f, -9.f, 0.f, 0.f, 8.f, -6.f, 0.f, -7.f, 0.f, 4.f}) / 2;
    EXPECT_TRUE(at::equal(b.buffer, want)) << b.buffer;
    // int32 indices + float32 values, sent once to the one other rank.
    EXPECT_EQ(codec->bytes_sent_last_step(), 3u * (4 + 4));
    EXPECT_EQ(codec->uncompressed_bytes_last_step(), 10u * 4);
  });
}

TEST(TopK, WarmupLowersTheRatioGeometrically) {
  TopKOptions o;
  o.ratio = 0.01;
  o.warmup_steps = 3;
  const std::vector<std::vector<int64_t>> shapes = {{1000}};
  std::vector<uint64_t> sent;
  run_ranks(2, [&](Communicator& comm) {
    auto codec = make_topk_codec(o);
    for (int step = 0; step < 5; ++step) {
      GradBucket b = make_bucket(shapes, grad_of(comm.rank(), step, 1000), step);
      codec->reduce(comm, b)->wait();
      if (comm.rank() == 0) sent.push_back(codec->bytes_sent_last_step() / 8);  // entries
    }
  });
  // ratio^(1/4), ratio^(2/4), ratio^(3/4), then ratio: 317, 100, 32, 10, 10 entries of 1000.
  EXPECT_EQ(sent, (std::vector<uint64_t>{317, 100, 32, 10, 10}));
}

// ---- error feedback ---------------------------------------------------------------------------

// A codec's error-feedback residuals laid out like a bucket of `shapes` (zeros where none).
at::Tensor residuals_of(const GradCodec& codec, const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<int64_t> offsets;
  int64_t n = 0;
  for (const auto& shape : shapes) {
    offsets.push_back(n);
    n += numel_of({shape});
  }
  at::Tensor out = at::zeros({n}, at::kDouble);
  for (const auto& [name, t] : codec.state()) {
    if (name.find("/error/") == std::string::npos && name.find("/residual/") == std::string::npos) {
      continue;
    }
    const int64_t p = std::stoll(name.substr(name.rfind('/') + 1));
    out.narrow(0, offsets.at(p), t.numel()).copy_(t.reshape({-1}));
  }
  return out;
}

// Over any number of steps, what the ranks transmitted plus what they still hold equals what
// they were given: sum_t world * decoded_t + sum_r residual_r = sum_t sum_r g_rt.
void expect_mass_conserved(const std::string& codec_name,
                           const std::function<std::shared_ptr<GradCodec>()>& make,
                           at::ScalarType dtype = at::kFloat) {
  SCOPED_TRACE(codec_name + " " + c10::toString(dtype));
  const int world = 2, steps = 6;
  const CodecRun run = run_codec(world, steps, kShapes, make, dtype);
  const int64_t n = numel_of(kShapes);
  at::Tensor given = at::zeros({n}, at::kDouble);
  at::Tensor accounted = at::zeros({n}, at::kDouble);
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) given += grad_of(r, s, n, dtype).to(at::kDouble);
    accounted += run.decoded[0][s].to(at::kDouble) * world;
  }
  for (int r = 0; r < world; ++r) accounted += residuals_of(*run.codecs[r], kShapes);
  EXPECT_LT((accounted - given).abs().max().item<double>(), 1e-4);
  EXPECT_GT(run.codecs[0]->compression_ratio(), 1.5);
  expect_same_bits_on_every_rank(run);
}

TEST(ErrorFeedback, ConservesMassForEveryCompressingCodec) {
  PowerSgdOptions o;
  o.start_iter = 0;
  // float32 takes the CPU kernels, float64 the generic ATen path.
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    expect_mass_conserved("topk", [] { return make_topk_codec({.ratio = 0.05}); }, dtype);
    expect_mass_conserved("sign", [] { return make_sign_codec(); }, dtype);
    expect_mass_conserved("powersgd", [&] { return make_powersgd_codec(o); }, dtype);
  }
}

// The float32 CPU kernels and the generic path (float64 here) code the same values alike.
TEST(CodecKernels, AgreeWithTheGenericPath) {
  for (const auto& [name, make] :
       std::vector<std::pair<std::string, std::function<std::shared_ptr<GradCodec>()>>>{
           {"topk", [] { return make_topk_codec({.ratio = 0.03}); }},
           {"sign", [] { return make_sign_codec(); }}}) {
    SCOPED_TRACE(name);
    const CodecRun fast = run_codec(2, 3, kShapes, make, at::kFloat);
    const CodecRun generic = run_codec(2, 3, kShapes, make, at::kDouble);
    for (int s = 0; s < 3; ++s) {
      const at::Tensor f = fast.decoded[0][s].to(at::kDouble);
      const at::Tensor g = generic.decoded[0][s];
      EXPECT_TRUE(at::equal(f.ne(0), g.ne(0))) << "step " << s << ": other entries chosen";
      EXPECT_TRUE(at::allclose(f, g, 1e-5, 1e-6)) << "step " << s;
    }
  }
}

TEST(CodecKernels, TopKBreaksTiesTowardsTheLowerIndexAndRanksNaNFirst) {
  run_ranks(1, [](Communicator& comm) {
    auto codec = make_topk_codec({.ratio = 0.3, .error_feedback = false});
    GradBucket ties = make_bucket({{10}}, at::full({10}, -2.0f));
    codec->reduce(comm, ties)->wait();
    EXPECT_TRUE(at::equal(ties.buffer.ne(0), at::arange(10).lt(3))) << ties.buffer;
    at::Tensor values = at::arange(10, at::kFloat);
    values[7] = std::nanf("");
    GradBucket nan = make_bucket({{10}}, values, 1);
    codec->reduce(comm, nan)->wait();
    EXPECT_TRUE(std::isnan(nan.buffer[7].item<float>()));
    EXPECT_EQ(nan.buffer[9].item<float>(), 9.0f);
    EXPECT_EQ(nan.buffer[8].item<float>(), 8.0f);
    EXPECT_EQ(at::count_nonzero(nan.buffer).item<int64_t>(), 3);
  });
}

// ---- sign -------------------------------------------------------------------------------------

TEST(Sign, DecodesMeanMagnitudeTimesSignAveragedOverRanks) {
  run_ranks(2, [](Communicator& comm) {
    auto codec = make_sign_codec({.error_feedback = false});
    const at::Tensor g = comm.rank() == 0 ? at::tensor({1.f, -3.f, 2.f, 0.f, 1.f, 1.f, 1.f, 1.f, -1.f})
                                          : at::tensor({-2.f, -2.f, 2.f, 2.f, 2.f, 2.f, 2.f, 2.f, 2.f});
    GradBucket b = make_bucket({{4}, {5}}, g);
    codec->reduce(comm, b)->wait();
    // Rank 0: scales 1.5 and 1, signs + - + + | + + + + -; rank 1: scales 2 and 2, - - + + | all +.
    const at::Tensor want = (at::tensor({1.5f, -1.5f, 1.5f, 1.5f, 1.f, 1.f, 1.f, 1.f, -1.f}) +
                             at::tensor({-2.f, -2.f, 2.f, 2.f, 2.f, 2.f, 2.f, 2.f, 2.f})) / 2;
    EXPECT_TRUE(at::equal(b.buffer, want)) << b.buffer;
    EXPECT_EQ(codec->bytes_sent_last_step(), 2u + 2 * 4);  // 9 bits in 2 bytes, 2 float scales
  });
}

// ---- state ------------------------------------------------------------------------------------

// Stopping after `cut` steps, saving every rank's state and loading it into fresh codecs gives
// the same bits as going on.
void expect_state_round_trip(const std::function<std::shared_ptr<GradCodec>()>& make) {
  const int world = 2, steps = 5, cut = 3;
  const int64_t n = numel_of(kShapes);
  const CodecRun straight = run_codec(world, steps, kShapes, make);
  std::vector<std::vector<at::Tensor>> resumed(world);
  run_ranks(world, [&](Communicator& comm) {
    auto first = make();
    std::map<std::string, at::Tensor> saved;
    for (int step = 0; step < cut; ++step) {
      GradBucket b = make_bucket(kShapes, grad_of(comm.rank(), step, n), step);
      first->reduce(comm, b)->wait();
    }
    for (const auto& [name, t] : first->state()) saved[name] = t.clone();
    auto second = make();
    second->load_state(saved);
    // A new DistributedDataParallel restarts the reducer's step at 0; the codec keeps its own
    // count.
    for (int step = cut; step < steps; ++step) {
      GradBucket b = make_bucket(kShapes, grad_of(comm.rank(), step, n), step - cut);
      second->reduce(comm, b)->wait();
      resumed[comm.rank()].push_back(b.buffer.clone());
    }
  });
  for (int r = 0; r < world; ++r) {
    for (int s = cut; s < steps; ++s) {
      EXPECT_TRUE(at::equal(resumed[r][s - cut], straight.decoded[r][s])) << "rank " << r << " step " << s;
    }
  }
}

TEST(CodecState, ResumingFromSavedStateGivesTheSameBits) {
  PowerSgdOptions p;
  p.start_iter = 2;
  p.rank = 2;
  expect_state_round_trip([&] { return make_powersgd_codec(p); });
  expect_state_round_trip([] { return make_topk_codec({.ratio = 0.1, .warmup_steps = 4}); });
  expect_state_round_trip([] { return make_sign_codec(); });
  expect_state_round_trip([&] { return make_cast_codec(at::kBFloat16, make_powersgd_codec(p)); });
}

TEST(CodecState, ResidualsFollowTheirParameterAcrossABucketRebuild) {
  run_ranks(2, [](Communicator& comm) {
    auto codec = make_topk_codec({.ratio = 0.2});
    GradBucket both = make_bucket({{10}, {10}}, grad_of(comm.rank(), 0, 20));
    codec->reduce(comm, both)->wait();
    const at::Tensor residual0 = codec->state().at("topk/residual/0").clone();
    const at::Tensor residual1 = codec->state().at("topk/residual/1").clone();
    // The rebuild puts parameter 1 first, alone, with a zero gradient: its bucket keeps only the
    // residual, so the largest residual entries are what is sent.
    GradBucket alone;
    alone.buffer = at::zeros({10});
    alone.param_indices = {1};
    alone.offsets = {0};
    alone.shapes = {{10}};
    alone.step = 1;
    codec->reduce(comm, alone)->wait();
    const auto after = codec->state();
    EXPECT_TRUE(at::equal(after.at("topk/residual/0"), residual0));
    EXPECT_NE(at::count_nonzero(after.at("topk/residual/1")).item<int64_t>(),
              at::count_nonzero(residual1).item<int64_t>());
  });
}

TEST(CodecState, UnknownOrMisshapenStateIsAConfigError) {
  auto codec = make_topk_codec();
  EXPECT_THROW(codec->load_state({{"powersgd/q/0", at::zeros({3, 1})}}), ConfigError);
  EXPECT_THROW(make_average_codec()->load_state({{"x", at::zeros({1})}}), ConfigError);
  EXPECT_THROW(codec->load_state({{"topk/step", at::zeros({2})}}), ConfigError);
  codec->load_state({{"topk/residual/0", at::zeros({7})}});
  run_ranks(1, [&](Communicator& comm) {
    GradBucket b = make_bucket({{10}}, at::ones({10}));
    try {
      codec->reduce(comm, b)->wait();
      ADD_FAILURE() << "a residual of 7 elements was accepted for a parameter of 10";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 0"), std::string::npos) << e.what();
    }
  });
}

// ---- registry ---------------------------------------------------------------------------------

TEST(MakeCodec, BuildsEveryCodecByName) {
  EXPECT_EQ(make_codec("average")->name(), "average");
  EXPECT_EQ(make_codec("fp16")->name(), "fp16");
  EXPECT_EQ(make_codec("bf16")->name(), "bf16");
  EXPECT_EQ(make_codec("powersgd", {{"rank", "4"}, {"start_iter", "0"}})->name(), "powersgd");
  EXPECT_EQ(make_codec("powersgd", {{"wire", "fp16"}})->name(), "powersgd+fp16");
  EXPECT_EQ(make_codec("topk", {{"ratio", "0.01"}, {"error_feedback", "false"}})->name(), "topk");
  EXPECT_EQ(make_codec("sign", {{"wire", "bf16"}})->name(), "sign+bf16");
  EXPECT_EQ(make_codec("auto", {{"wire", "fp16"}, {"min_speedup", "2"}})->name(), "auto");
}

void expect_config_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what() << "\nlacks: " << part;
    }
  }
}

TEST(MakeCodec, BadNamesParametersAndValuesSayWhatIsAllowed) {
  expect_config_error([] { make_codec("powerSGD"); }, {"'powerSGD'", "powersgd, topk, sign"});
  expect_config_error([] { make_codec("powersgd", {{"rnak", "4"}}); },
                      {"'rnak'", "rank", "start_iter"});
  expect_config_error([] { make_codec("powersgd", {{"rank", "four"}}); }, {"'rank'", "'four'", "integer"});
  expect_config_error([] { make_codec("powersgd", {{"rank", "0"}}); }, {"rank", "at least 1"});
  expect_config_error([] { make_codec("topk", {{"ratio", "1.5"}}); }, {"ratio", "(0, 1]"});
  expect_config_error([] { make_codec("topk", {{"error_feedback", "yes"}}); }, {"boolean"});
  expect_config_error([] { make_codec("sign", {{"wire", "fp8"}}); }, {"'fp8'", "fp16, bf16"});
  expect_config_error([] { make_codec("fp16", {{"wire", "bf16"}}); }, {"'bf16'"});
  expect_config_error([] { make_codec("average", {{"rank", "2"}}); }, {"'rank'", "wire"});
  expect_config_error([] { make_codec("auto", {{"wire", "fp8"}}); }, {"'fp8'", "fp16 or bf16"});
  expect_config_error([] { make_codec("auto", {{"min_speedup", "-1"}}); }, {"min_speedup", ">= 0"});
}

TEST(MakeCodec, OneCodecServesOneCommunicator) {
  run_ranks(1, [&](Communicator& comm) {
    auto codec = make_codec("average");
    GradBucket b = make_bucket({{2}}, at::ones({2}));
    codec->reduce(comm, b)->wait();
    auto other = comm.new_group({0});
    EXPECT_THROW(codec->reduce(*other, b), ConfigError);
  });
}

}  // namespace
}  // namespace tandem
