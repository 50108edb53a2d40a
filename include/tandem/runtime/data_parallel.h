// The data-parallel seam: what DistributedDataParallel and ShardedDataParallel share.
//
// - DistributedDataParallelOptions (config section `ddp`): buckets, unused parameters, overlap,
//   the gradient codec and mixed precision, read by both wrappers (ShardedDataParallel takes its
//   buckets and mixed precision from here too).
// - bucket_caps(): the bucket caps checked and converted to bytes, once, for both.
// - NoSyncGuard: `auto guard = wrapper.no_sync();` makes forwards and backwards only accumulate
//   gradients locally until the guard goes; the next synchronised backward reduces them.
// - wrapped_forward(): the forward of either wrapper around the module's own.
// A wrapper differs from the other only in what it shards (ShardingPolicy,
// tandem/runtime/sharded_data_parallel.h): nothing (DDP), optimizer state, gradients, parameters.
//
// Ownership: plain values; NoSyncGuard refers to its wrapper's flag and must not outlive it.
// Thread-safety: one training thread per wrapper. Errors: bucket_caps() throws ConfigError
// naming the config key.
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/collectives/grad_codec.h>
#include <tandem/runtime/mixed_precision.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem {

struct DistributedDataParallelOptions {
  double bucket_cap_mb = 25.0;        // later buckets close at this size
  double first_bucket_cap_mb = 1.0;   // the first bucket is small so communication starts early
  bool find_unused_parameters = false;
  // .grad tensors live in the buckets: no copy in or out (measured: W1 step overhead 54% -> 22%).
  // They are plain tensors, so optimizers' zero_grad() works; set false to keep separate .grad.
  bool gradient_as_bucket_view = true;
  bool broadcast_buffers = true;         // rank 0's buffers to all ranks before each forward
  // ddp.overlap: reduce buckets while backward runs (kOn), after it (kOff), or kAuto: always for
  // a model on a GPU (the reduction runs on a stream or host threads the GPU's compute does not
  // need); for a CPU model only when this host has a core to spare for communication
  // (LOCAL_WORLD_SIZE x compute threads < cores): without one, overlapped communication steals
  // the compute's cores and costs more than it hides (bench data_parallel on 2 cores).
  enum class Overlap { kAuto, kOn, kOff };
  Overlap overlap = Overlap::kAuto;
  std::shared_ptr<GradCodec> codec;      // null: average all-reduce
  MixedPrecisionOptions mixed_precision; // precision.param_dtype / precision.reduce_in_fp32
  // Where every parameter must be (train.device, resolved by tandem::Context); unset: any one
  // device, the same for all parameters.
  std::optional<c10::Device> device;
};

// The bucket caps of `options` in bytes. Throws ConfigError (naming ddp.bucket_cap_mb and
// ddp.first_bucket_cap_mb, and `who` as the wrapper) unless both are positive and finite.
struct BucketCaps {
  int64_t first_bytes = 0;
  int64_t bytes = 0;
};
BucketCaps bucket_caps(const DistributedDataParallelOptions& options, const char* who);

// Throws ConfigError unless every parameter is on options.device (when set) and all on one
// device: the message names the first parameter elsewhere and what to do. `who`: the wrapper.
void check_parameter_devices(const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names,
                             const DistributedDataParallelOptions& options, const char* who);

// ddp.overlap resolved for gradients on `device` reduced over `comm`: kAuto overlaps on any
// device but the CPU, and on the CPU only when this host has a core to spare for communication
// (LOCAL_WORLD_SIZE x compute threads < cores).
bool overlap_pays(DistributedDataParallelOptions::Overlap overlap, const Communicator& comm,
                  c10::Device device);

// Gradient accumulation under either wrapper (see the top of this file).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(bool& sync) : sync_(sync), previous_(sync) { sync_ = false; }
  ~NoSyncGuard() { sync_ = previous_; }
  // Returned by value only (guaranteed copy elision), never copied or moved.
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  bool& sync_;
  const bool previous_;
};

namespace detail {

inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... T>
void collect_tensors(const std::tuple<T...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collect_tensors(e, out), ...); }, t);
}
template <class A, class B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collect_tensors(p.first, out);
  collect_tensors(p.second, out);
}
// Non-tensor outputs carry no gradient.
template <class T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

// The forward of a data-parallel wrapper: core.pre_forward(), the module's forward (floating
// inputs cast to core.input_dtype() under mixed precision), then core.post_forward() with the
// output's tensors (what backward starts from).
template <class Core, class Module, class... Args>
auto wrapped_forward(Core& core, Module& module, Args&&... args) {
  core.pre_forward();
  auto output = module.forward(cast_input(std::forward<Args>(args), core.input_dtype())...);
  std::vector<at::Tensor> tensors;
  collect_tensors(output, tensors);
  core.post_forward(tensors);
  return output;
}

}  // namespace detail

}  // namespace tandem
