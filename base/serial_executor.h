// SerialExecutor: one named thread that runs submitted tasks one after another, in submission
// order. tandem's background work that must stay ordered uses it: a codec's per-bucket stages,
// the pipeline's sends, the Gloo communicator's operations, the checkpoint writer.
//
// Tasks report their own results (a Work, a promise, a status under the caller's lock); an
// exception escaping a task is a bug in that task and is kept for drain() to rethrow, so nothing
// is lost silently. The thread starts with the first submit() and is joined by the destructor
// after every queued task ran.
// Thread-safety: submit(), drain() and pending() may be called from any thread, concurrently.
// Not copyable. Errors: drain() rethrows the first exception a task let escape.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tandem {

class SerialExecutor {
 public:
  // `thread_name`: what `top -H` and the timeline show (at most 15 characters are kept).
  explicit SerialExecutor(std::string thread_name);
  // Runs what is queued, then joins the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Runs `task` on the executor's thread after every task submitted before it.
  void submit(std::function<void()> task);
  // Blocks until every task submitted before this call ran; rethrows (once) the first exception
  // a task let escape.
  void drain();
  // Tasks submitted and not finished yet.
  std::size_t pending() const;

 private:
  void loop();

  const std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  std::size_t running_ = 0;
  bool stopping_ = false;
  std::exception_ptr escaped_;
  std::thread thread_;
};

}  // namespace tandem
