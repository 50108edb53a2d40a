// detail::BackwardPass (runtime/data_parallel/backward_pass.h).
#include "runtime/data_parallel/backward_pass.h"

#include <tandem/base/errors.h>

#include <torch/csrc/autograd/engine.h>

#include <utility>

namespace tandem::detail {

BackwardPass::Mode BackwardPass::begin_forward() {
  const Mode before = mode_;
  const bool unfinished = mode_ == Mode::kUnfinished || (mode_ == Mode::kSynchronizing && callback_queued_);
  std::string message = std::move(unfinished_);
  reset();
  if (unfinished) {
    throw Error(!message.empty() ? message
                                 : "tandem: " + wrapper_ + ": forward called while the previous "
                                   "backward had not finished (it raised, or its graph was dropped "
                                   "midway).");
  }
  return before;
}

void BackwardPass::arm(bool sync) {
  mode_ = sync ? Mode::kSynchronizing : Mode::kAccumulating;
  callback_queued_ = false;
}

bool BackwardPass::on_gradient(const std::string& name, bool twice, std::function<void()> finalize) {
  if (mode_ == Mode::kFinalized) {
    throw Error("tandem: " + wrapper_ + ": parameter '" + name + "' received a gradient after the "
                "backward of its forward had finished: backward ran twice through one forward "
                "(retain_graph), and that gradient would not be reduced. Run one backward per "
                "forward.");
  }
  if (!armed()) return false;
  if (twice) {
    throw Error("tandem: " + wrapper_ + ": parameter '" + name + "' received its gradient twice in "
                "one backward (backward run twice through one forward, or a reentrant use of the "
                "parameter). Run one backward per forward, or accumulate under no_sync().");
  }
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback(std::move(finalize));
  }
  return true;
}

void BackwardPass::finish() { mode_ = mode_ == Mode::kSynchronizing ? Mode::kFinalized : Mode::kIdle; }

void BackwardPass::fail(std::string message) {
  mode_ = Mode::kUnfinished;
  unfinished_ = std::move(message);
}

void BackwardPass::reset() {
  mode_ = Mode::kIdle;
  callback_queued_ = false;
  unfinished_.clear();
}

}  // namespace tandem::detail
