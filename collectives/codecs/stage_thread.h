// Internal: runs a compressing codec's per-bucket stages (encode, collectives, decode) on one
// thread of the codec's own ("tandem-codec", a SerialExecutor), in submission order. Backward goes
// on while a bucket is encoded, and every rank issues the stages' collectives in the same order
// (bucket order).
//
// Streams (a CUDA bucket): the caller's current stream filled the bucket, so submit() records an
// event there; the stage runs on a side stream of the codec's that waits for that event (the
// stage's kernels and collectives are queued on it), and records `done` on it when its work is
// queued. The returned Work's wait() blocks the host until the stage has run, then makes the
// waiting thread's current stream wait for `done`: the consumer never reads the bucket before
// the codec's kernels wrote it. The bucket's memory is recorded on the side stream, so the
// caching allocator keeps it until that stream is past it.
#pragma once

#include "base/serial_executor.h"

#include <tandem/collectives/grad_codec.h>

#include <c10/core/Stream.h>

#include <functional>
#include <optional>
#include <string>

namespace tandem::detail {

class StageThread {
 public:
  explicit StageThread(std::string codec_name)
      : codec_name_(std::move(codec_name)), executor_("tandem-codec") {}
  // The executor's destructor runs what is queued, then joins.

  // Runs `job` after every job submitted before it (the thread starts on the first call), on the
  // codec's stream for a CUDA bucket (see above). The Work completes when `job` returned or
  // rethrows what it threw; waiting on it times out after four communicator timeouts (a job
  // waits for at most three collectives in turn) and then aborts `wire`.
  WorkPtr submit(Communicator& wire, const GradBucket& bucket, std::function<void()> job);
  // Blocks until every job submitted so far finished (they report their errors in their Work).
  void drain() { executor_.drain(); }

 private:
  const std::string codec_name_;
  std::optional<c10::Stream> stream_;  // the codec's side stream (stage thread only)
  SerialExecutor executor_;  // last: joined first, while the members above still live
};

}  // namespace tandem::detail
