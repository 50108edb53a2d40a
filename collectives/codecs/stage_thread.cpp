#include "collectives/codecs/stage_thread.h"

#include "collectives/async_work.h"
#include "collectives/tensor_checks.h"

#include <c10/core/GradMode.h>
#include <tandem/base/trace.h>

#include <pthread.h>

namespace tandem {

StageThread::~StageThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

WorkPtr StageThread::submit(Communicator& wire, const GradBucket& bucket,
                            std::function<void()> job) {
  OpDescription what{codec_name_, static_cast<uint64_t>(bucket.step),
                     "bucket " + std::to_string(bucket.index) + ", " +
                         tensor_summary(bucket.buffer),
                     ""};
  auto work = std::make_shared<AsyncWork>(std::move(what), wire.timeout() * 4,
                                          [&wire](const std::string& msg) { wire.abort(msg); });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(work, std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
  return work;
}

void StageThread::loop() {
  pthread_setname_np(pthread_self(), "tandem-codec");
  c10::AutoGradMode no_grad(false);  // codec arithmetic is never part of a graph
  for (;;) {
    std::pair<std::shared_ptr<AsyncWork>, std::function<void()>> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      trace::Span span("codec stage", trace::kCodec);  // encode, wire ops and decode of a bucket
      if (trace::enabled()) span.arg("codec", codec_name_).arg("op", next.first->describe());
      next.second();
      next.first->finish();
    } catch (...) {
      next.first->finish(std::current_exception());
    }
  }
}

}  // namespace tandem
