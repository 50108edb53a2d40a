// Internal: runs a compressing codec's per-bucket stages (encode, collectives, decode) on one
// thread of the codec's own, in submission order. Backward goes on while a bucket is encoded, and
// every rank issues the stages' collectives in the same order (bucket order).
#pragma once

#include <tandem/collectives/grad_codec.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace tandem {

class AsyncWork;

class StageThread {
 public:
  explicit StageThread(std::string codec_name) : codec_name_(std::move(codec_name)) {}
  ~StageThread();  // runs what is queued, then joins
  StageThread(const StageThread&) = delete;
  StageThread& operator=(const StageThread&) = delete;

  // Runs `job` after every job submitted before it (the thread starts on the first call). The
  // Work completes when `job` returned or rethrows what it threw; waiting on it times out after
  // four communicator timeouts (a job waits for at most three collectives in turn) and then
  // aborts `wire`.
  WorkPtr submit(Communicator& wire, const GradBucket& bucket, std::function<void()> job);

 private:
  void loop();

  const std::string codec_name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<AsyncWork>, std::function<void()>>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem
