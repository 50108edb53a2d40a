// libtandemrun_c10d.so: agent_store.h's StoreConnection over libtorch's c10d::TCPStore. Loaded by
// tandemrun (dlopen) only for a multi-node run; the only part of tandemrun that links libtorch.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tools/tandemrun/elastic/agent_store.h"

namespace tandem::launcher {
namespace {

// c10d bounds only its waits: a check, get or add sent to a host behind a partition never
// returns. So each request runs on a thread of its own, and the caller waits at most the timeout;
// after one goes unanswered the connection is abandoned (that thread keeps the store alive until
// it returns, if ever) and every later request fails at once.
class C10dStoreConnection final : public StoreConnection {
 public:
  C10dStoreConnection(c10::intrusive_ptr<c10d::TCPStore> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::string& value) override {
    call<int>([key, value](c10d::TCPStore& s) {
      s.set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return 0;
    });
  }
  std::optional<std::string> get(const std::string& key) override {
    return call<std::optional<std::string>>([key](c10d::TCPStore& s) -> std::optional<std::string> {
      if (!s.check({key})) return std::nullopt;
      const std::vector<uint8_t> bytes = s.get(key);
      return std::string(bytes.begin(), bytes.end());
    });
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return call<int64_t>([key, delta](c10d::TCPStore& s) { return s.add(key, delta); });
  }
  void set_timeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    store_->setTimeout(timeout);
  }

 private:
  template <class T>
  struct Pending {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<T> value;
    std::exception_ptr error;
  };

  template <class T>
  T call(std::function<T(c10d::TCPStore&)> request) {
    if (abandoned_) throw std::runtime_error(abandoned_why_);
    auto pending = std::make_shared<Pending<T>>();
    std::thread([pending, store = store_, request = std::move(request)] {
      std::optional<T> value;
      std::exception_ptr error;
      try {
        value.emplace(request(*store));
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(pending->mutex);
      pending->value = std::move(value);
      pending->error = error;
      pending->done = true;
      pending->done_cv.notify_one();
    }).detach();
    std::unique_lock<std::mutex> lock(pending->mutex);
    if (!pending->done_cv.wait_for(lock, timeout_, [&] { return pending->done; })) {
      abandoned_ = true;
      abandoned_why_ = "the store did not answer a request within " +
                       std::to_string(timeout_.count()) + " ms";
      throw std::runtime_error(abandoned_why_);
    }
    if (pending->error) std::rethrow_exception(pending->error);
    return std::move(*pending->value);
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::chrono::milliseconds timeout_;
  bool abandoned_ = false;
  std::string abandoned_why_;
};

}  // namespace
}  // namespace tandem::launcher

extern "C" __attribute__((visibility("default"))) tandem::launcher::StoreConnection*
tandemrun_connect_c10d_store(const char* host, int port, int server, long long timeout_ms,
                             char* error, std::size_t error_size) {
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = server != 0;
    options.waitWorkers = false;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    return new tandem::launcher::C10dStoreConnection(
        c10::make_intrusive<c10d::TCPStore>(host, options), options.timeout);
  } catch (const std::exception& e) {
    if (error_size > 0) {
      const std::size_t n = std::min(std::strlen(e.what()), error_size - 1);
      std::memcpy(error, e.what(), n);
      error[n] = '\0';
    }
    return nullptr;
  }
}
