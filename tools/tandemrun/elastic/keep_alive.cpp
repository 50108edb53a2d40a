#include "tools/tandemrun/elastic/keep_alive.h"

#include <exception>

#include "tools/tandemrun/elastic/rendezvous_store.h"

namespace tandem::launcher {

KeepAlive::KeepAlive(std::unique_ptr<StoreConnection> connection, std::string key,
                     std::chrono::milliseconds interval)
    : connection_(std::move(connection)), key_(std::move(key)), interval_(interval) {
  thread_ = std::thread([this] { loop(); });
}

KeepAlive::~KeepAlive() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::optional<std::string> KeepAlive::lost() const {
  if (!failed_) return std::nullopt;
  return error_;
}

void KeepAlive::loop() {
  using Clock = std::chrono::steady_clock;
  auto next = Clock::now();
  while (!stop_) {
    if (Clock::now() >= next) {
      try {
        connection_->add(key_, 1);
      } catch (const std::exception& e) {
        error_ = printable(e.what());
        failed_ = true;
        return;
      }
      next = Clock::now() + interval_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // stop_ is seen within 10 ms
  }
}

bool PeerLiveness::stale(const std::string& agent_id, long long count) {
  const auto now = Clock::now();
  const auto it = seen_.find(agent_id);
  if (it == seen_.end() || it->second.first != count) {
    seen_[agent_id] = {count, now};
    return false;
  }
  return now - it->second.second > timeout_;
}

}  // namespace tandem::launcher
