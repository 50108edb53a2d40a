#include "collectives/codecs/stage_thread.h"

#include "collectives/async_work.h"
#include "collectives/tensor_checks.h"

#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <tandem/base/trace.h>

#include <memory>

namespace tandem::detail {

namespace {

// A CUDA stage's order on the device: `ready` on the stream that filled the bucket, `done` on
// the codec's stream after the stage's work. c10's device-agnostic types, as in
// gloo_host_staging.h: libtandem links no CUDA library.
struct StageEvents {
  explicit StageEvents(c10::Device d)
      : device(d), guard(d.type()), ready(d.type()), done(d.type()) {}
  c10::Device device;
  c10::impl::VirtualGuardImpl guard;
  c10::Event ready;
  c10::Event done;
};

// The stage's Work: the host job, then the waiting thread's current stream waits for `done`.
class StageWork final : public Work {
 public:
  StageWork(std::shared_ptr<AsyncWork> job, std::shared_ptr<StageEvents> events)
      : job_(std::move(job)), events_(std::move(events)) {}
  void wait(std::chrono::milliseconds timeout) override {
    job_->wait(timeout);
    events_->done.block(events_->guard.getStream(events_->device));
  }
  // `done` is recorded before the job completes, so it is read only after.
  bool is_completed() override { return job_->is_completed() && events_->done.query(); }
  std::string describe() const override { return job_->describe(); }
  std::optional<std::chrono::steady_clock::time_point> completed_at() override {
    return job_->completed_at();
  }

 private:
  std::shared_ptr<AsyncWork> job_;
  std::shared_ptr<StageEvents> events_;
};

}  // namespace

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
  std::shared_ptr<StageEvents> events;
  if (bucket.buffer.is_cuda()) {
    events = std::make_shared<StageEvents>(bucket.buffer.device());
    events->ready.record(events->guard.getStream(events->device));  // the producer's point
  }
  executor_.submit([this, work, events, buffer = bucket.buffer, job = std::move(job)] {
    try {
      c10::AutoGradMode no_grad(false);  // codec arithmetic is never part of a graph
      std::optional<c10::StreamGuard> on_stream;
      if (events) {
        if (!stream_ || stream_->device() != events->device) {
          stream_ = events->guard.getStreamFromGlobalPool(events->device);
        }
        events->ready.block(*stream_);
        events->guard.recordDataPtrOnStream(buffer.storage().data_ptr(), *stream_);
        on_stream.emplace(*stream_);  // the job's kernels and collectives queue on it
      }
      trace::Span span("codec stage", trace::kCodec);  // encode, wire ops and decode of a bucket
      if (trace::enabled()) span.arg("codec", codec_name_).arg("op", work->describe());
      job();
      if (events) events->done.record(*stream_);
      work->finish();
    } catch (...) {
      work->finish(std::current_exception());
    }
  });
  if (!events) return work;
  return std::make_shared<StageWork>(std::move(work), std::move(events));
}

}  // namespace tandem::detail
