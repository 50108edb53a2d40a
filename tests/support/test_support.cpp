#include "tests/support/test_support.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::testing {

const std::vector<at::ScalarType> kAllDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                                at::kBFloat16, at::kChar, at::kByte,
                                                at::kShort, at::kInt, at::kLong};
const std::vector<ReduceOp> kAllReduceOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProduct};

void run_threads(int world,
                 const std::function<void(int rank, c10::intrusive_ptr<c10d::Store> store)>& body) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank, store);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

void run_ranks(int world, const std::function<void(Communicator&)>& body, GlooOptions options) {
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, world, options);
    body(*comm);
  });
}

}  // namespace tandem::testing
