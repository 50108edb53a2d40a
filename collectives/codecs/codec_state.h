// Internal: the state compressing codecs keep per parameter, in a form that survives the bucket
// rebuild and goes into checkpoints.
#pragma once

#include <tandem/collectives/grad_codec.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tandem::detail {

// Error-feedback residuals, one per parameter, stored flat per bucket: a codec works on one
// contiguous tensor laid out like the bucket's buffer, while the residuals stay keyed by
// parameter. With keep_undo(), every layout keeps two buffers, the residual before the step that
// last wrote it and the one after, so a step a fault-tolerant run aborted can be undone without a
// copy. Used by one thread at a time.
class ResidualBank {
 public:
  // The bucket's residual at the start of (reducer) step `step` (`before`, to read) and where
  // its residual after that step goes (`after`, to write in full): one tensor, unless undo is
  // kept. Both are flat and laid out like `bucket.buffer` (zeros for parameters never seen). When
  // the bucket's composition changed (the rebuild, or after load()), the residuals are copied
  // into a new layout once. Throws ConfigError when a loaded residual's size does not match its
  // parameter.
  struct Step {
    at::Tensor before, after;
  };
  Step step(const GradBucket& bucket, int64_t step, const std::string& codec_name);
  // The whole bucket's error feedback for its step: writes gradient + residual before the step
  // into the residual after it, and returns that (the codec subtracts what it sends from it).
  at::Tensor accumulate(const GradBucket& bucket, const std::string& codec_name);

  // Every residual by parameter index (flat views of the live storage).
  const std::map<int64_t, at::Tensor>& residuals() const { return residuals_; }
  void load(int64_t param, at::Tensor residual);

  // Whether step() keeps the residual before each step (one more buffer per layout).
  void keep_undo(bool keep) { keep_undo_ = keep; }
  // Puts back, in every layout that step `step` or a later one wrote, the residual it had
  // before. Throws tandem::Error when that was not kept (undo off, or two steps back).
  void undo_from(int64_t step, const std::string& codec_name);

 private:
  struct Layout {
    at::Tensor current, before;  // before: the other buffer (undo kept)
    int64_t step = -1;           // the step that wrote `current` (-1: none yet)
    int64_t before_step = -1;    // the step that wrote `before` (-1: none, or not kept)
    bool undoable = false;       // `before` holds the residual before `step`
  };
  Layout& layout_of(const GradBucket& bucket, const std::string& codec_name);
  // Points the parameters' residuals at `layout.current`.
  void point(const std::vector<int64_t>& params, const Layout& layout);

  std::map<int64_t, at::Tensor> residuals_;
  std::map<std::vector<int64_t>, Layout> flats_;  // by the bucket's parameter list
  bool keep_undo_ = false;
};

// The codec's own count of synchronised steps: the reducer's step (which restarts at 0 with a new
// DistributedDataParallel) plus what was loaded from a checkpoint.
class CodecStep {
 public:
  // The step `bucket` belongs to; remembers it.
  int64_t at(const GradBucket& bucket) {
    reducer_next_ = bucket.step + 1;
    return offset_ + bucket.step;
  }
  // Steps begun so far (what a checkpoint saves).
  int64_t next() const { return offset_ + reducer_next_; }
  void load(int64_t next) { offset_ = next - reducer_next_; }
  // Forgets the steps from reducer step `step` on (a step a fault-tolerant run aborted).
  void undo_from(int64_t step) { reducer_next_ = std::min(reducer_next_, step); }

 private:
  int64_t offset_ = 0;
  int64_t reducer_next_ = 0;
};

using PerParam = std::map<int64_t, at::Tensor>;

// A codec's named state: "<codec>/step" (when `step` is given) and "<codec>/<kind>/<param>" for
// the tensors of every kind (live tensors, not copies).
std::map<std::string, at::Tensor> codec_state(const std::string& codec, const CodecStep* step,
                                              const std::map<std::string, const PerParam*>& kinds);

// Reads what codec_state() wrote: the step into `step`, every other tensor (cloned) into its
// kind's `load`. Throws ConfigError for a name of another codec or kind, or a malformed step.
void load_codec_state(const std::string& codec, const std::map<std::string, at::Tensor>& state,
                      CodecStep* step,
                      const std::map<std::string, std::function<void(int64_t, at::Tensor)>>& kinds);

}  // namespace tandem::detail
