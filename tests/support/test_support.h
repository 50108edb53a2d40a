// Test helpers: ranks as threads over one in-process HashStore.
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <functional>

namespace tandem::testing {

// Runs `body(comm)` on `world` threads, each holding a Gloo communicator connected through a fresh
// shared HashStore. Joins all threads, then rethrows the first exception any rank threw.
void run_ranks(int world, const std::function<void(Communicator&)>& body,
               GlooOptions options = {});

}  // namespace tandem::testing
