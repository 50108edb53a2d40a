// Internal: lets Gloo's rendezvous (through libtandem_gloo's GlooKeyValue seam) use any c10d store
// (TCPStore, FileStore, HashStore, PrefixStore); its waits are store_wait.h's.
#pragma once

#include "collectives/gloo/gloo_mesh.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

namespace tandem::detail {

class GlooStoreAdapter final : public GlooKeyValue {
 public:
  // `what` names the rendezvous in errors, e.g. "rendezvous of 4 ranks under 'tandem/world'";
  // `world_size` lets a timeout name every absent rank, not only the one Gloo waited for.
  GlooStoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string what, int world_size);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  // Throws TimeoutError naming the keys (ranks) that never appeared (wait_for_keys).
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string what_;
  int world_size_;
};

}  // namespace tandem::detail
