// The agents' key-value store: one connection to a c10d::TCPStore, the store torchrun's c10d
// rendezvous uses too (docs/launcher.md "Multi-node").
//
// tandemrun does not link libtorch: the multi-node agent loads the store from a module
// (libtandemrun_c10d.so, the only part of tandemrun linked against libtorch) the first time it
// connects, so single-node runs start without it. Ownership: the caller owns each connection.
// Thread-safety: one connection per thread. Errors: std::runtime_error with c10d's message (an
// unreachable or lost store, a port already bound), or when a request is not answered within the
// timeout (a partition): the connection is then abandoned and every later request fails at once;
// RendezvousError when the module cannot be loaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace tandem::launcher {

class StoreConnection {
 public:
  virtual ~StoreConnection() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value under `key`, or nullopt when there is none yet (never waits).
  virtual std::optional<std::string> get(const std::string& key) = 0;
  // Adds `delta` to the counter under `key` (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Bounds each later operation (connecting may take longer: the host may start late).
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

struct StoreAddress {
  std::string host;
  int port = 0;
  bool server = false;  // host the store in this process (binds host:port) and connect to it
  std::chrono::milliseconds timeout{0};  // for connecting and for each operation
};

std::unique_ptr<StoreConnection> connect_store(const StoreAddress& address);

// The module's entry point (extern "C", looked up with dlsym): a new connection, or nullptr with
// the reason in `error`.
using ConnectStoreFn = StoreConnection* (*)(const char* host, int port, int server,
                                            long long timeout_ms, char* error,
                                            std::size_t error_size);
inline constexpr const char* kConnectStoreSymbol = "tandemrun_connect_c10d_store";

}  // namespace tandem::launcher
