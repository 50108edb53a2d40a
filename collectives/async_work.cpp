#include "collectives/async_work.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/flight_recorder.h>

#include <cstdio>

namespace tandem::detail {

std::string OpDescription::str() const {
  std::string s = name + " #" + std::to_string(seq);
  if (!detail.empty()) s += " (" + detail + ")";
  if (!ranks.empty()) s += " on ranks " + ranks;
  return s;
}

std::string format_elapsed(AsyncWork::Clock::time_point since) {
  const double s = std::chrono::duration<double>(AsyncWork::Clock::now() - since).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

std::string dump_flight_recorder(const std::string& reason) {
  const std::string path = FlightRecorder::instance().dump(reason);
  if (path.empty()) return "";
  const std::string dir = path.substr(0, path.rfind('/'));
  return " The flight recorder wrote " + path + "; once every rank has dumped, `tandem-trace flight " +
         dir + "` says which rank is behind and where the ranks disagree.";
}

AsyncWork::AsyncWork(OpDescription description, std::chrono::milliseconds default_timeout,
                     std::function<std::string(const std::string&)> on_timeout)
    : description_(std::move(description)),
      default_timeout_(default_timeout),
      on_timeout_(std::move(on_timeout)) {}

void AsyncWork::finish(std::exception_ptr error) {
  std::string what;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "unknown error";
    }
  }
  FlightRecorder::instance().ended(description_.flight_id, what);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    finished_at_ = Clock::now();
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

std::optional<AsyncWork::Clock::time_point> AsyncWork::completed_at() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) return std::nullopt;
  return finished_at_;
}

bool AsyncWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void AsyncWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kDefaultTimeout) timeout = default_timeout_;
  const auto wait_start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_cv_.wait_for(lock, timeout, [&] { return done_; })) {
    lock.unlock();
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.2f s",
                  std::chrono::duration<double>(Clock::now() - wait_start).count());
    const std::string msg = "tandem: " + description_.str() + " did not complete within " +
                            waited + " (issued " + format_elapsed(issued_at_) +
                            " ago). A peer rank is hung or dead, or the ranks issued collectives in "
                            "different orders. The communicator is now unusable; restart the group.";
    const std::string who = on_timeout_ ? on_timeout_(msg) : std::string();
    throw TimeoutError(msg + who + dump_flight_recorder("timeout"));
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace tandem::detail
