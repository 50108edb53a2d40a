#include "collectives/codecs/stage_thread.h"

#include "collectives/async_work.h"
#include "collectives/tensor_checks.h"

#include <c10/core/GradMode.h>
#include <tandem/base/trace.h>

namespace tandem::detail {

WorkPtr StageThread::submit(Communicator& wire, const GradBucket& bucket,
                            std::function<void()> job) {
  OpDescription what{codec_name_, static_cast<uint64_t>(bucket.step),
                     "bucket " + std::to_string(bucket.index) + ", " +
                         tensor_summary(bucket.buffer),
                     ""};
  auto work = std::make_shared<AsyncWork>(std::move(what), wire.timeout() * 4,
                                          [&wire](const std::string& msg) {
                                            wire.abort(msg);
                                            return std::string();
                                          });
  executor_.submit([this, work, job = std::move(job)] {
    try {
      c10::AutoGradMode no_grad(false);  // codec arithmetic is never part of a graph
      trace::Span span("codec stage", trace::kCodec);  // encode, wire ops and decode of a bucket
      if (trace::enabled()) span.arg("codec", codec_name_).arg("op", work->describe());
      job();
      work->finish();
    } catch (...) {
      work->finish(std::current_exception());
    }
  });
  return work;
}

}  // namespace tandem::detail
