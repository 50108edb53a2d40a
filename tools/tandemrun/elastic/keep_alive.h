// Liveness in the multi-node rendezvous: each agent's keep-alive thread bumps a counter in the
// store; the others judge it lost when the counter stops moving for --rdzv-node-timeout-s.
//
// Ownership: KeepAlive owns its thread and its own store connection (a stuck main-thread request
// must not delay the beats). Thread-safety: KeepAlive's methods are for the thread that made it;
// PeerLiveness is for one thread. Errors: none thrown; a lost store shows as lost().
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "tools/tandemrun/elastic/agent_store.h"

namespace tandem::launcher {

class KeepAlive {
 public:
  // Adds 1 to `key` every `interval` on `connection`, from a thread of its own, until destroyed.
  KeepAlive(std::unique_ptr<StoreConnection> connection, std::string key,
            std::chrono::milliseconds interval);
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // Once the thread could not reach the store: why (it has stopped then).
  std::optional<std::string> lost() const;

 private:
  void loop();

  std::unique_ptr<StoreConnection> connection_;
  std::string key_;
  std::chrono::milliseconds interval_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::string error_;  // written before failed_ is set
  std::thread thread_;
};

// Other agents' keep-alive counters as this agent saw them change.
class PeerLiveness {
 public:
  explicit PeerLiveness(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // `count` is agent_id's counter now; true when it has not changed for longer than the timeout.
  bool stale(const std::string& agent_id, long long count);

 private:
  using Clock = std::chrono::steady_clock;
  std::chrono::milliseconds timeout_;
  std::map<std::string, std::pair<long long, Clock::time_point>> seen_;  // count, when it changed
};

}  // namespace tandem::launcher
