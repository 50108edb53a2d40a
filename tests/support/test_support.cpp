#include "test_support.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::testing {

void run_ranks(int world, const std::function<void(Communicator&)>& body, GlooOptions options) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto comm = connect_gloo(store, rank, world, options);
        body(*comm);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace tandem::testing
