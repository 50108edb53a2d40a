// GradCodec: what a gradient bucket becomes on the wire.
//
// The Reducer hands every full bucket to its codec's reduce(), which starts the reduction across
// the communicator and returns a Work; when that Work completes, `bucket.buffer` must hold the
// average of the ranks' gradients (what a plain average all-reduce would give, up to the codec's
// approximation), with identical bits on every rank. reduce() counts the traffic (bytes this rank
// puts on the wire, and what a plain all-reduce of the bucket would have put there) and routes
// the codec's collectives through that count; a codec implements encode_and_reduce().
//
// Codecs that keep state (error-feedback residuals, low-rank factors, step counters) key it by
// parameter index (`GradBucket::param_indices`), which is stable across the one-time bucket
// rebuild, and expose it as named tensors (state()/load_state()) so training-state checkpoints
// can save and restore it. A codec instance serves one communicator (one DistributedDataParallel).
//
// Ready-made codecs (fp16/bf16, PowerSGD, top-k, sign, and a cast wrapper around any of them):
// tandem/collectives/compression.h.
//
// Ownership: the Reducer shares its codec; a codec owns its state tensors and, for compressing
// codecs, one stage thread ("tandem-codec") joined when the codec is destroyed. The bucket belongs
// to the Reducer and stays untouched by it until the Work completed.
// Thread-safety: reduce() is called from the autograd thread (or the forward thread for unused
// parameters), one bucket at a time, in bucket order, identically on every rank. Codecs that run
// stages on a thread of their own keep their state to that thread; state()/load_state() must not
// run while a backward is in flight.
// Errors: reduce() throws ConfigError when one codec instance is used with two communicators;
// load_state() throws ConfigError for names or shapes it does not know; communication failures
// come from the Work's wait() (CommError, TimeoutError; a compressing codec's Work times out
// after four communicator timeouts and then aborts the communicator).
#pragma once

#include <tandem/collectives/communicator.h>

#include <atomic>
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
  // Element offset of each parameter in buffer, aligned as a tensor of its own would be
  // (bucket_plan.h's flat_layout): the elements between parameters belong to none and are zero.
  std::vector<int64_t> offsets;
  std::vector<std::vector<int64_t>> shapes;       // each parameter's shape
  int64_t step = 0;        // synchronised steps completed before this one
};

namespace detail {
class CountingCommunicator;
}  // namespace detail

class GradCodec {
 public:
  GradCodec();
  virtual ~GradCodec();
  GradCodec(const GradCodec&) = delete;
  GradCodec& operator=(const GradCodec&) = delete;

  // Short name used in configs and reports ("average", "fp16", "powersgd", "topk+bf16", ...).
  virtual std::string name() const = 0;

  // Starts reducing `bucket.buffer` across `comm`; see the contract above. The bucket stays
  // alive and untouched by the reducer until the returned Work completed. Throws ConfigError when
  // one codec instance is used with two communicators.
  WorkPtr reduce(Communicator& comm, GradBucket& bucket);

  // Named state tensors for checkpoints (empty for stateless codecs). load_state() accepts what
  // state() returned (on any rank count; residuals are per rank) and throws ConfigError on names
  // or shapes it does not know.
  virtual std::map<std::string, at::Tensor> state() const { return {}; }
  virtual void load_state(const std::map<std::string, at::Tensor>& state);

  // Undoing an aborted step (step-level fault tolerance, docs/fault_tolerance.md; the
  // DistributedDataParallel wrapper calls these). With keep_step_undo(true), set before a step's
  // first bucket, a codec with state also keeps what it held before its latest step: one more
  // copy of its error feedback, written instead of copied. undo_steps_from(step) waits for the
  // stages still running (their collectives must fail or finish), then forgets what reducer step
  // `step` (GradBucket::step) and later did: state() is again what it was before that step. It
  // throws tandem::Error when that was not kept. Stateless codecs have nothing to keep or undo.
  virtual void keep_step_undo(bool keep) { (void)keep; }
  virtual void undo_steps_from(int64_t step) { (void)step; }

  // Traffic of the most recent synchronised step (complete once its backward returned): bytes
  // this rank sent, as the ring algorithms send them (all-reduce 2(n-1)/n of the buffer,
  // all-gather (n-1) times the input), and the bytes a plain all-reduce of the same buckets in
  // their own dtype would have sent. compression_ratio() = uncompressed / sent (1 when nothing
  // was sent).
  uint64_t bytes_sent_last_step() const;
  uint64_t uncompressed_bytes_last_step() const;
  double compression_ratio() const;

 protected:
  // The codec's algorithm. Every collective of the bucket goes through `wire` (which counts the
  // traffic and may cast it); `wire` lives as long as the codec.
  virtual WorkPtr encode_and_reduce(Communicator& wire, GradBucket& bucket) = 0;

 private:
  friend class CastCodec;  // wraps another codec's encode_and_reduce with a casting wire

  std::atomic<uint64_t> uncompressed_bytes_{0};
  std::shared_ptr<detail::CountingCommunicator> wire_;
};

// The default: one average all-reduce per bucket.
std::shared_ptr<GradCodec> make_average_codec();

}  // namespace tandem
