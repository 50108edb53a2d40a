// Internal: a Work completed by another thread (the backend's op thread or a device stream poller).
#pragma once

#include <tandem/collectives/communicator.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace tandem::detail {

// What an op is, for messages: "allreduce #12 (sum, 4.00 MiB float32) on ranks [0, 1]". A
// communicator's op takes its number and flight-recorder entry from Communicator::issue().
struct OpDescription {
  std::string name;
  uint64_t seq = 0;
  std::string detail;
  std::string ranks;
  bool p2p = false;                  // send/recv: numbered apart from collectives
  uint64_t flight_id = UINT64_MAX;   // its flight-recorder entry (none: not a communicator's op)
  std::string str() const;
};
// Dumps the flight recorder after a failure; returns a sentence for the error message naming the
// file and how to read it ("" when the recorder is off or the dump failed).
std::string dump_flight_recorder(const std::string& reason);

class AsyncWork : public Work {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_timeout` runs (once) when a wait times out, with the TimeoutError's message: the owner
  // marks the communicator broken there, and returns a sentence to add (who never joined).
  AsyncWork(OpDescription description, std::chrono::milliseconds default_timeout,
            std::function<std::string(const std::string&)> on_timeout);

  void wait(std::chrono::milliseconds timeout = kDefaultTimeout) override;
  bool is_completed() override;
  std::string describe() const override { return description_.str(); }

  // Called exactly once by the thread that ran the op; `error` null on success.
  void finish(std::exception_ptr error = nullptr);

  const OpDescription& description() const { return description_; }
  // The op's entry in the flight recorder (its runner marks it started; finish() ends it).
  uint64_t flight_id() const { return description_.flight_id; }
  Clock::time_point issued_at() const { return issued_at_; }
  std::optional<Clock::time_point> completed_at() override;

 private:
  const OpDescription description_;
  const std::chrono::milliseconds default_timeout_;
  const std::function<std::string(const std::string&)> on_timeout_;
  const Clock::time_point issued_at_ = Clock::now();
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  Clock::time_point finished_at_{};
  std::exception_ptr error_;
};

// Seconds since `since`, formatted "1.23 s".
std::string format_elapsed(AsyncWork::Clock::time_point since);
// "4.00 MiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace tandem::detail
