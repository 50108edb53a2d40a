// libtandemrun_c10d.so: agent_store.h's StoreConnection over libtorch's c10d::TCPStore. Loaded by
// tandemrun (dlopen) only for a multi-node run; the only part of tandemrun that links libtorch.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "tools/tandemrun/agent_store.h"

namespace tandem::launcher {
namespace {

class C10dStoreConnection final : public StoreConnection {
 public:
  explicit C10dStoreConnection(c10::intrusive_ptr<c10d::TCPStore> store)
      : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::optional<std::string> get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    const std::vector<uint8_t> bytes = store_->get(key);
    return std::string(bytes.begin(), bytes.end());
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
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
        c10::make_intrusive<c10d::TCPStore>(host, options));
  } catch (const std::exception& e) {
    if (error_size > 0) {
      const std::size_t n = std::min(std::strlen(e.what()), error_size - 1);
      std::memcpy(error, e.what(), n);
      error[n] = '\0';
    }
    return nullptr;
  }
}
