// GradCodec: what a gradient bucket becomes on the wire.
//
// The Reducer hands every full bucket to its codec, which starts the reduction across the
// communicator and returns a Work; when that Work completes, `bucket.buffer` must hold the
// average of the ranks' gradients (what a plain average all-reduce would give, up to the codec's
// approximation). Codecs that keep state (error-feedback residuals, low-rank factors, step
// counters) key it by parameter index (`GradBucket::param_indices`), which is stable across the
// one-time bucket rebuild, and expose it as named tensors so training-state checkpoints can save
// and restore it.
//
// Thread-safety: reduce() is called from the autograd thread (or the forward thread for unused
// parameters), one bucket at a time, in bucket order, identically on every rank.
#pragma once

#include <tandem/collectives/communicator.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

struct GradBucket {
  int64_t index = 0;       // position in the current bucket plan (changes at the rebuild)
  at::Tensor buffer;       // flat, contiguous gradients of one dtype; reduced in place
  std::vector<int64_t> param_indices;             // stable keys, in buffer order
  std::vector<int64_t> offsets;                   // element offset of each parameter in buffer
  std::vector<std::vector<int64_t>> shapes;       // each parameter's shape
  int64_t step = 0;        // synchronised steps completed before this one
};

class GradCodec {
 public:
  virtual ~GradCodec() = default;
  // Short name used in configs and reports ("average", "fp16", "powersgd", ...).
  virtual std::string name() const = 0;
  // Starts reducing `bucket.buffer` across `comm`; see the contract above. The bucket stays
  // alive and untouched by the reducer until the returned Work completed.
  virtual WorkPtr reduce(Communicator& comm, GradBucket& bucket) = 0;
  // Named state tensors for checkpoints (empty for stateless codecs).
  virtual std::map<std::string, at::Tensor> state() const { return {}; }
  virtual void load_state(const std::map<std::string, at::Tensor>& state) {}
  // Bytes this rank put on the wire in the last synchronised step.
  virtual uint64_t bytes_sent_last_step() const { return 0; }
};

// The default: one average all-reduce per bucket (sum, then divide by the world size).
std::shared_ptr<GradCodec> make_average_codec();

}  // namespace tandem
