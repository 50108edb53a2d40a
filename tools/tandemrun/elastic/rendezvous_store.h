// The multi-node agents' shared store, as the rendezvous uses it (docs/launcher.md "Multi-node").
//
// What: one agent hosts the store (node rank 0, or the one that binds --rdzv-endpoint), the
// others connect; the host proves it knows the job token (keyed digests, job_token.h; the token
// is never sent) and clients that cannot check the proof leave. Keys of this job live under
// "tandemrun/<rdzv-id>/". Every agent registers and keeps itself alive (keep_alive.h). Only plain
// numbers and [A-Za-z0-9._:-] words are parsed from the store; texts are only printed.
//
// Ownership: owns its two connections (this thread's, the keep-alive's). Thread-safety: one
// thread calls the methods. Errors: RendezvousError (a tandem::Error) for a foreign store, an
// unreachable endpoint or a lost store host, with the endpoint and what to do.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <tandem/base/errors.h>

#include "tools/tandemrun/elastic/agent_store.h"
#include "tools/tandemrun/elastic/keep_alive.h"
#include "tools/tandemrun/launch/launcher_options.h"

namespace tandem::launcher {

class RendezvousError : public Error {
 public:
  using Error::Error;
};

class RendezvousStore {
 public:
  // Hosts or connects to the store, checks the job token (`token` must not be empty), registers
  // this agent and starts its keep-alive.
  RendezvousStore(const LauncherOptions& options, std::string token);
  ~RendezvousStore();  // a client tells the others it left
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  bool is_host() const { return host_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& agent_id() const { return agent_id_; }
  // Where this node's workers are reachable (--local-addr, else chosen from the endpoint).
  const std::string& local_addr() const { return local_addr_; }

  // Keys below this job's prefix.
  void put(const std::string& key, const std::string& value) { set_key(prefix_ + key, value); }
  std::optional<std::string> try_get(const std::string& key) { return get_key(prefix_ + key); }
  long long counter(const std::string& key, long long delta) {
    return add_key(prefix_ + key, delta);
  }

  // The keyed digest of a record's fields (a record of another job does not match).
  std::string record_digest(const std::string& fields) const;

  // Throws RendezvousError when the keep-alive thread lost the store. On the host, also logs
  // agents of another job that were turned away since the last call.
  void check();
  // True when `agent_id`'s keep-alive has not moved for --rdzv-node-timeout-s.
  bool stale(const std::string& agent_id);
  // Polls until every agent that ever registered has left or gone silent (bounded by the node
  // timeout + 2 s): the host calls it before exiting so that no agent loses the store early.
  void linger();

 private:
  void verify_host();
  std::string describe_error(const std::exception& e) const;
  // Whole keys; a failing store becomes a RendezvousError.
  void set_key(const std::string& key, const std::string& value);
  std::optional<std::string> get_key(const std::string& key);
  long long add_key(const std::string& key, long long delta);

  LauncherOptions options_;
  std::string token_;
  std::string endpoint_;
  bool host_ = false;
  std::string prefix_;
  std::string agent_id_;
  std::string local_addr_;
  std::string host_nonce_;
  long long foreign_seen_ = 0;  // host: agents with another token seen so far
  std::unique_ptr<StoreConnection> store_;
  std::unique_ptr<KeepAlive> keep_alive_;
  PeerLiveness peers_;
};

// "HOST:PORT" -> (host, port); `default_port` when there is no port. Throws ConfigError.
std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port);

// A word as the rendezvous exchanges them: [A-Za-z0-9._:-], 1..255 characters.
bool is_word(const std::string& text);
// Text from another agent, made safe to print: no control characters, at most ~2000 bytes.
std::string printable(std::string text);

}  // namespace tandem::launcher
