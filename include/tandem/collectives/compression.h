// Gradient compression: ready-made GradCodecs for DistributedDataParallel.
//
//   tandem::DistributedDataParallelOptions o;
//   o.codec = tandem::make_codec("powersgd", {{"rank", "4"}});     // by name, e.g. from a config
//   o.codec = tandem::make_powersgd_codec({.rank = 4});              // or typed
//   o.codec = tandem::make_cast_codec(at::kHalf, tandem::make_topk_codec({.ratio = 0.01}));
//
// Codecs (docs/compression.md says when each pays off, with measured figures):
//   average   plain average all-reduce (the default)
//   fp16/bf16 the bucket travels as float16/bfloat16: pre-divided by the rank count (no
//             overflow), all-reduced, cast back in place
//   powersgd  rank-r approximation of every gradient viewed as shape[0] x rest (Vogels et al.
//             2019): P = M Q and Q = M^T P are all-reduced instead of M; error feedback, warm
//             start, plain all-reduce for the first `start_iter` steps, matrices too small to gain
//             `min_compression_rate` and 1-D tensors all-reduced uncompressed in one batch
//   topk      the k = ratio * numel largest-magnitude entries of each bucket, exchanged as
//             (index, value) pairs by all-gather, with error feedback
//   sign      1 bit per entry plus one scale (mean |entry|) per tensor, by all-gather, with error
//             feedback (EF-signSGD, Karimireddy et al. 2019)
//   any of them +fp16 / +bf16 (make_cast_codec, or parameter wire=fp16): every floating tensor the
//             codec sends travels in that precision (e.g. PowerSGD's P and Q factors)
//   auto      average or bf16 (or fp16), whichever this communicator's link makes faster: at its
//             first bucket it times a 4 MiB all-reduce both ways, the fastest of 5 (collective:
//             every rank must reach it), takes the slowest rank's times and rank 0's verdict,
//             prints it on rank 0, and reports it in name() ("auto(bf16)", "auto(average)").
//             A timing decides, so the choice (and the bits) can differ between runs.
//
// Determinism: every rank decodes the same bits (sums run in one order on every rank); the same
// seed, world size and bucket plan give the same bits run after run.
// State: error-feedback residuals (per rank), Q factors and the codec's own step counter, keyed
// by parameter index; state() names them "<codec>/<kind>/<param index>" and "<codec>/step".
// Stage threads: compressing codecs run each bucket's stages (encode, collectives, decode) on a
// thread of their own, in bucket order, so backward goes on meanwhile.
// Ownership: every factory call returns a new codec (shared_ptr) that serves one
// DistributedDataParallel: its state belongs to that model. A cast wrapper owns the codec it wraps.
// Thread-safety: the factories are reentrant; a codec is used as grad_codec.h says.
// Errors: unknown codec names, unknown parameters and out-of-range values throw ConfigError
// naming the codec, the parameter, the value and what is allowed.
#pragma once

#include <tandem/collectives/grad_codec.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace tandem {

struct PowerSgdOptions {
  int64_t rank = 1;                  // r: columns of P and Q (clamped to min(rows, cols))
  int64_t start_iter = 10;           // plain all-reduce for the first steps (no error feedback)
  double min_compression_rate = 2.0; // compress a matrix only if rows*cols > rate*(rows+cols)*r
  bool error_feedback = true;
  bool warm_start = true;            // reuse last step's Q; otherwise a fresh random Q each step
  uint64_t seed = 0;                 // the initial Q (same on every rank)
};

struct TopKOptions {
  double ratio = 0.01;               // fraction of each bucket's entries sent, in (0, 1]
  bool error_feedback = true;
  // Over the first `warmup_steps` steps the ratio falls geometrically from 1 to `ratio`
  // (Deep Gradient Compression's sparsity warm-up); 0 disables.
  int64_t warmup_steps = 0;
};

struct SignOptions {
  bool error_feedback = true;
};

struct AutoOptions {
  at::ScalarType wire = at::kBFloat16;  // the cast it may choose: at::kBFloat16 or at::kHalf
  // Cast only if the plain all-reduce of the probe takes at least this many times as long as
  // the cast one (0: always cast).
  double min_speedup = 1.25;
};

std::shared_ptr<GradCodec> make_powersgd_codec(PowerSgdOptions options = {});
std::shared_ptr<GradCodec> make_topk_codec(TopKOptions options = {});
std::shared_ptr<GradCodec> make_sign_codec(SignOptions options = {});
// `inner`'s floating tensors travel as `wire_dtype` (at::kHalf or at::kBFloat16); state, name
// and traffic are the inner codec's ("powersgd+fp16"; the cast average is named "fp16"/"bf16").
std::shared_ptr<GradCodec> make_cast_codec(at::ScalarType wire_dtype,
                                           std::shared_ptr<GradCodec> inner = make_average_codec());
std::shared_ptr<GradCodec> make_auto_codec(AutoOptions options = {});

// By name, with parameters as strings (what configs hold):
//   "average" | "fp16" | "bf16" (no parameters)
//   "powersgd": rank, start_iter, min_compression_rate, error_feedback, warm_start, seed
//   "topk": ratio, error_feedback, warmup_steps
//   "sign": error_feedback
//   "auto": min_speedup; its wire (fp16 | bf16, default bf16) is the cast it may choose
//   every other codec also takes wire = fp32 | fp16 | bf16 (the cast wrapper above).
// Booleans are true/false/1/0.
std::shared_ptr<GradCodec> make_codec(const std::string& name,
                                      const std::map<std::string, std::string>& params = {});

}  // namespace tandem
