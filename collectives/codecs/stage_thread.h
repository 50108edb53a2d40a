// Internal: runs a compressing codec's per-bucket stages (encode, collectives, decode) on one
// thread of the codec's own ("tandem-codec", a SerialExecutor), in submission order. Backward goes
// on while a bucket is encoded, and every rank issues the stages' collectives in the same order
// (bucket order).
#pragma once

#include "base/serial_executor.h"

#include <tandem/collectives/grad_codec.h>

#include <functional>
#include <string>

namespace tandem::detail {

class StageThread {
 public:
  explicit StageThread(std::string codec_name)
      : codec_name_(std::move(codec_name)), executor_("tandem-codec") {}
  // The executor's destructor runs what is queued, then joins.

  // Runs `job` after every job submitted before it (the thread starts on the first call). The
  // Work completes when `job` returned or rethrows what it threw; waiting on it times out after
  // four communicator timeouts (a job waits for at most three collectives in turn) and then
  // aborts `wire`.
  WorkPtr submit(Communicator& wire, const GradBucket& bucket, std::function<void()> job);
  // Blocks until every job submitted so far finished (they report their errors in their Work).
  void drain() { executor_.drain(); }

 private:
  const std::string codec_name_;
  SerialExecutor executor_;  // last: joined first, while the name above still lives
};

}  // namespace tandem::detail
