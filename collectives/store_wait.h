// Internal: a rendezvous's wait on a c10d store (TCPStore, FileStore, HashStore, PrefixStore)
// that names who never arrived. Gloo's connect (gloo/gloo_store_adapter.h) and the
// shared-memory setup (shm/shm_channel.h) both wait through it.
// Thread-safety: as the store's. Errors: TimeoutError (see below).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace tandem::detail {

// Waits until every key of `keys` exists in `store`. Past `timeout` throws TimeoutError naming
// `what` (e.g. "rendezvous of 4 ranks under 'tandem/world'") and what is absent: for keys that
// end in a rank number ("3", "rank_3"), every rank in [0, world_size) whose key of that stem is
// missing, not only the one the store happened to wait for.
void wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const std::string& what, int world_size);

}  // namespace tandem::detail
