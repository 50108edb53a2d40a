// Test helpers: ranks as threads over one in-process HashStore.
#pragma once

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace tandem::testing {

// Every dtype and reduce op the collectives support.
extern const std::vector<at::ScalarType> kAllDtypes;
extern const std::vector<ReduceOp> kAllReduceOps;

// Runs `body(rank, store)` on `world` threads sharing one fresh HashStore (each thread connects
// whatever communicators it needs). Joins all threads, then rethrows the first exception.
void run_threads(int world,
                 const std::function<void(int rank, c10::intrusive_ptr<c10d::Store> store)>& body);

// Runs `body(comm)` on `world` threads, each holding a Gloo communicator connected through a fresh
// shared HashStore. Joins all threads, then rethrows the first exception any rank threw.
void run_ranks(int world, const std::function<void(Communicator&)>& body,
               GlooOptions options = {});

// A shared_ptr to `comm` that does not own it (for APIs that share their communicator).
inline std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

// The message of the E that `f` throws, or "(no error)" when it throws none (another exception
// passes through).
template <class E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}
inline std::string config_error_of(const std::function<void()>& f) { return message_of<ConfigError>(f); }

}  // namespace tandem::testing
