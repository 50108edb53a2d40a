// The auto codec: on its first bucket it measures, on the communicator it serves, whether a cast
// all-reduce beats the plain one, agrees with the other ranks, and sends every bucket that way.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include "collectives/codec_wire.h"

#include <ATen/ops/full.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>

namespace tandem {

namespace {

// Large enough to measure bandwidth rather than latency; 35 ms on a 1 Gbit/s link.
constexpr int64_t kProbeBytes = int64_t{4} << 20;
constexpr int kRounds = 5;  // timed rounds after one warm-up round; the fastest counts

std::string wire_name(at::ScalarType dtype) { return dtype == at::kHalf ? "fp16" : "bf16"; }

class AutoCodec final : public GradCodec {
 public:
  explicit AutoCodec(AutoOptions options) : options_(options) {
    if (options_.wire != at::kHalf && options_.wire != at::kBFloat16) {
      throw ConfigError(std::string("tandem: make_auto_codec: wire dtype ") +
                        c10::toString(options_.wire) +
                        " is not supported; use at::kHalf (fp16) or at::kBFloat16 (bf16).");
    }
    if (!(options_.min_speedup >= 0)) {
      throw ConfigError("tandem: auto: min_speedup must be >= 0, got " +
                        std::to_string(options_.min_speedup) + ".");
    }
  }

  std::string name() const override {
    switch (choice_.load()) {
      case kPlain: return "auto(average)";
      case kCast: return "auto(" + wire_name(options_.wire) + ")";
      default: return "auto";
    }
  }

 protected:
  WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) override {
    if (choice_.load() == kUndecided) {
      // Probe on the communicator under the counting wrapper: the probe is not gradient traffic.
      Communicator* below = wire.underlying();
      choice_ = decide(below != nullptr ? *below : wire, bucket.buffer.options());
    }
    if (choice_.load() == kPlain) return wire.allreduce(bucket.buffer, ReduceOp::kAvg);
    if (!casting_) casting_ = std::make_unique<detail::CastingCommunicator>(wire, options_.wire);
    return casting_->allreduce(bucket.buffer, ReduceOp::kAvg);
  }

 private:
  enum Choice { kUndecided, kPlain, kCast };

  // Collective: every rank calls it at its first bucket, so the probe ops line up.
  Choice decide(Communicator& comm, const at::TensorOptions& bucket_options) {
    if (comm.size() == 1) return kPlain;  // nothing goes on a wire
    const at::Tensor probe = at::full({kProbeBytes / 4}, 1.0f, bucket_options.dtype(at::kFloat));
    detail::CastingCommunicator cast(comm, options_.wire);
    // What the transfer takes, not its enqueue: on a device, between two timing events on the
    // current stream (the wait puts the op's end on it); on the host, until the op completed (a
    // wait with a timeout blocks until then on every backend).
    auto seconds = [&](Communicator& c) {
      if (probe.is_cpu()) {
        const auto start = std::chrono::steady_clock::now();
        c.allreduce(probe, ReduceOp::kAvg)->wait(c.timeout());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      const c10::DeviceType type = probe.device().type();
      const c10::impl::VirtualGuardImpl guard(type);
      c10::Event start(type, c10::EventFlag::BACKEND_DEFAULT);
      c10::Event end(type, c10::EventFlag::BACKEND_DEFAULT);
      start.record(guard.getStream(probe.device()));
      c.allreduce(probe, ReduceOp::kAvg)->wait();
      end.record(guard.getStream(probe.device()));
      end.synchronize();
      return start.elapsedTime(end) / 1e3;  // milliseconds
    };
    double plain = std::numeric_limits<double>::infinity(), casted = plain;
    for (int round = 0; round <= kRounds; ++round) {
      const double p = seconds(comm), c = seconds(cast);
      if (round == 0) continue;  // warm-up: first touch of the buffers and the wire copy
      plain = std::min(plain, p);
      casted = std::min(casted, c);
    }
    // The slowest rank's figures decide, and rank 0's decision holds everywhere (even if the
    // ranks were given different options): ranks must agree on what goes on the wire.
    // Read on the host: waited for there (a backend whose wait only orders a stream returns
    // before the op ran).
    const at::Tensor times = at::tensor({plain, casted}, at::kDouble);
    comm.allreduce(times, ReduceOp::kMax)->wait(comm.timeout());
    plain = times[0].item<double>();
    casted = times[1].item<double>();
    const bool pays = plain >= options_.min_speedup * casted;
    const at::Tensor verdict = at::tensor({pays ? 1 : 0}, at::kInt);
    comm.broadcast(verdict, 0)->wait(comm.timeout());
    const Choice choice = verdict.item<int>() == 1 ? kCast : kPlain;
    if (comm.rank() == 0) {
      const double bus_bytes = 2.0 * (comm.size() - 1) / comm.size() * kProbeBytes;
      std::fprintf(stderr,
                   "tandem: codec auto (%d ranks, %s): a %lld MiB all-reduce took %.2f ms in fp32 "
                   "(%.2f GB/s bus bandwidth) and %.2f ms as %s, %.2fx as fast; auto casts from "
                   "%gx (compression.auto.min_speedup): gradients travel as %s.\n",
                   comm.size(), comm.backend().c_str(), static_cast<long long>(kProbeBytes >> 20),
                   plain * 1e3, bus_bytes / plain / 1e9, casted * 1e3,
                   wire_name(options_.wire).c_str(), plain / casted, options_.min_speedup,
                   choice == kCast ? wire_name(options_.wire).c_str() : "fp32");
    }
    return choice;
  }

  const AutoOptions options_;
  std::atomic<int> choice_{kUndecided};
  std::unique_ptr<detail::CastingCommunicator> casting_;
};

}  // namespace

std::shared_ptr<GradCodec> make_auto_codec(AutoOptions options) {
  return std::make_shared<AutoCodec>(options);
}

}  // namespace tandem
