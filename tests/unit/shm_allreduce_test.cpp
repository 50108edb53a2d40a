// Allreduce through shared memory (GlooOptions::shared_memory): used exactly when every rank of a
// communicator shares the host and wants it; results equal to the TCP path (exactly where the
// arithmetic is exact, within a stated rounding bound for floating sums and products) and
// bitwise identical on every rank; many pipeline steps; aborts, dead, hung and mismatched peers
// fail within the timeout; nothing is left in /dev/shm. Ranks as real processes (a SIGKILLed or
// stopped peer, the two-process timings) are in shm_allreduce_process_test.cpp.
//
// Whether shared memory is in use is observed from outside: each engine maps one segment, which
// shows in /proc/self/maps as "/dev/shm/tandem-shm-<creator pid>-<random> (deleted)" (the name is
// unlinked as soon as every rank mapped it).
#include "tests/support/test_support.h"
#include "tests/unit/shm_test_util.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

namespace tandem {
namespace {

using namespace std::chrono_literals;
using namespace shm_test;
using testing::run_threads;

const auto& kDtypes = testing::kAllDtypes;
const auto& kOps = testing::kAllReduceOps;

// ---------------------------------------------------------------------------------------------

TEST(ShmAllreduce, UsedExactlyWhenEveryRankWantsItAndLeavesNothingBehind) {
  const pid_t pid = ::getpid();
  ASSERT_EQ(shm_mappings(), 0);
  // Two ranks, on: one segment each, already unlinked once connect returned.
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 2, shm_options());
    comm->barrier()->wait();
    EXPECT_EQ(shm_mappings(), 2);
    EXPECT_EQ(shm_files_of(pid), 0);
    auto t = at::full({1000}, float(rank + 1));
    comm->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0f)));
    comm->barrier()->wait();
  });
  EXPECT_EQ(shm_mappings(), 0);
  EXPECT_EQ(shm_files_of(pid), 0);

  // Off on one rank only: no rank uses it, and the results are still right.
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    GlooOptions o = shm_options();
    o.shared_memory = rank == 0;
    auto comm = connect_gloo(store, rank, 2, o);
    comm->barrier()->wait();
    EXPECT_EQ(shm_mappings(), 0);
    auto t = at::full({1000}, float(rank + 1));
    comm->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0f)));
  });

  // A world of one needs no segment.
  run_threads(1, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 1, shm_options());
    EXPECT_EQ(shm_mappings(), 0);
  });
}

TEST(ShmAllreduce, SubGroupsGetTheirOwnSegment) {
  const pid_t pid = ::getpid();
  run_threads(3, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 3, shm_options(64 << 10));
    comm->barrier()->wait();
    EXPECT_EQ(shm_mappings(), 3);
    comm->barrier()->wait();  // nobody maps a group's segment before every rank counted
    {
      auto group = comm->new_group({0, 2});
      auto half = comm->split(rank == 1 ? -1 : 0, 0);
      comm->barrier()->wait();
      EXPECT_EQ(shm_mappings(), 3 + 2 + 2);
      if (rank != 1) {
        for (auto& g : {group, half}) {
          ASSERT_NE(g, nullptr);
          auto t = at::full({100003}, float(rank));
          g->allreduce(t, ReduceOp::kSum)->wait();
          EXPECT_TRUE(at::equal(t, at::full({100003}, 2.0f)));
        }
      }
      comm->barrier()->wait();
    }
    comm->barrier()->wait();
    EXPECT_EQ(shm_mappings(), 3);
    comm->barrier()->wait();
  });
  EXPECT_EQ(shm_mappings(), 0);
  EXPECT_EQ(shm_files_of(pid), 0);
}

class ShmVersusTcp : public ::testing::TestWithParam<int> {};

// Every dtype and op over sizes around and across many pipeline steps (4 KiB slots: 1024
// float32 per step), against the TCP path and against float64; every rank bitwise the same.
TEST_P(ShmVersusTcp, EveryDtypeAndOpAcrossManySegments) {
  const int world = GetParam();
  const std::vector<int64_t> sizes = {0, 1, 2, 3, 17, 1023, 1024, 1025, 3 * 4096 + 5, 100003};
  std::vector<std::vector<at::Tensor>> results(world);  // [rank] -> shm results in order
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto shm = connect_gloo(store, rank, world, shm_options(4096));
    auto tcp = connect_gloo(store, rank, world, tcp_options());
    for (int64_t n : sizes) {
      for (auto dtype : kDtypes) {
        for (auto op : kOps) {
          if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
          auto a = input_for(rank, n, dtype, op);
          auto b = a.clone();
          shm->allreduce(a, op)->wait();
          tcp->allreduce(b, op)->wait();
          const auto [want, scale] = reference(world, n, dtype, op);
          const std::string what = label(dtype, op, n, rank);
          expect_close(a, b, scale, world, dtype, op, what + " (shm vs tcp)");
          expect_close(a, want, scale, world, dtype, op, what + " (shm vs float64)");
          results[rank].push_back(a);
        }
      }
    }
  });
  for (int r = 1; r < world; ++r) {
    ASSERT_EQ(results[r].size(), results[0].size());
    for (size_t i = 0; i < results[0].size(); ++i) {
      const auto& x = results[0][i];
      const auto& y = results[r][i];
      ASSERT_EQ(x.numel(), y.numel());
      EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()), 0)
          << "result " << i << " (" << c10::toString(x.scalar_type()) << ", " << x.numel()
          << " elements) differs between rank 0 and rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmVersusTcp, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Default slot size: a 64 MiB tensor plus an odd tail goes in many steps through both buffers;
// a non-contiguous view of a large tensor comes back into the caller's strides.
TEST(ShmAllreduce, LargeTensorsWithTheDefaultSlot) {
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 2, shm_options());
    const int64_t n = (int64_t(64) << 20) / 4 + 3;
    auto t = (at::arange(n, at::kInt) % 1000 + rank).to(at::kFloat);
    comm->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t, ((at::arange(n, at::kInt) % 1000) * 2 + 1).to(at::kFloat)));
    auto base = at::arange(3000 * 1001, at::kDouble).reshape({3000, 1001}) + rank;
    auto view = base.t();
    comm->allreduce(view, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(at::equal(base, at::arange(3000 * 1001, at::kDouble).reshape({3000, 1001}) + 0.5));
  });
}

// Ranks issuing different allreduces: a CommError naming both, at once, instead of garbage.
TEST(ShmAllreduce, MismatchedSizesFailAtOnceOnEveryRank) {
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 2, shm_options(4096, 60s));
    auto t = at::ones({rank == 0 ? 100 : 5000});
    const auto start = Clock::now();
    std::string msg;
    try {
      comm->allreduce(t)->wait();
    } catch (const CommError& e) {
      msg = e.what();
    }
    EXPECT_LT(seconds_since(start), 10.0);
    EXPECT_NE(msg.find("different collectives"), std::string::npos) << msg;
    EXPECT_NE(msg.find("400 B float32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("19.53 KiB float32"), std::string::npos) << msg;
  });
}

// abort() on the waiting rank itself (from another thread) and on the peer both end a wait that
// would otherwise last the 60 s timeout.
TEST(ShmAllreduce, AbortUnblocksAWaitingAllreduce) {
  for (const bool abort_on_waiter : {true, false}) {
    std::atomic<bool> done{false};
    run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
      auto comm = connect_gloo(store, rank, 2, shm_options(4096, 60s));
      comm->barrier()->wait();
      if (rank == 1) {  // never issues the allreduce
        if (!abort_on_waiter) {
          std::this_thread::sleep_for(300ms);
          comm->abort("test: peer gives up");
        }
        while (!done) std::this_thread::sleep_for(5ms);
        return;
      }
      std::thread aborter;
      if (abort_on_waiter) {
        aborter = std::thread([&] {
          std::this_thread::sleep_for(300ms);
          comm->abort("test: local abort");
        });
      }
      auto t = at::ones({100000});
      const auto start = Clock::now();
      std::string msg;
      try {
        comm->allreduce(t)->wait();
      } catch (const CommError& e) {
        msg = e.what();
      }
      done = true;
      if (aborter.joinable()) aborter.join();
      EXPECT_LT(seconds_since(start), 10.0) << msg;
      EXPECT_NE(msg.find("allreduce #1"), std::string::npos) << msg;
      EXPECT_NE(msg.find(abort_on_waiter ? "aborted on this rank" : "rank 1 (world rank 1) aborted"),
                std::string::npos)
          << msg;
    });
  }
}

// A peer that destroys its communicator while this rank waits for it: CommError at once.
TEST(ShmAllreduce, PeerLeavingFailsTheWaiterAtOnce) {
  std::atomic<bool> rank0_waiting{false};
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 2, shm_options(4096, 60s));
    comm->barrier()->wait();
    if (rank == 1) {
      while (!rank0_waiting) std::this_thread::sleep_for(5ms);
      std::this_thread::sleep_for(200ms);
      return;  // destroys the communicator without issuing the allreduce
    }
    auto t = at::ones({100000});
    auto work = comm->allreduce(t);
    rank0_waiting = true;
    const auto start = Clock::now();
    std::string msg;
    try {
      work->wait();
    } catch (const CommError& e) {
      msg = e.what();
    }
    EXPECT_LT(seconds_since(start), 10.0) << msg;
    EXPECT_NE(msg.find("destroyed its communicator"), std::string::npos) << msg;
  });
}

// A hung peer (never contributes) ends in TimeoutError within the op timeout; the wait inside
// the engine is bounded too (the op thread finishes, so the communicator can be destroyed).
TEST(ShmAllreduce, HungPeerTimesOut) {
  std::atomic<bool> rank0_done{false};
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 2, shm_options(4096, 500ms));
    comm->barrier()->wait();
    if (rank == 1) {
      while (!rank0_done) std::this_thread::sleep_for(5ms);
      return;
    }
    auto t = at::ones({100000});
    const auto start = Clock::now();
    std::string msg;
    try {
      comm->allreduce(t)->wait(10s);  // the engine's own 500 ms bound must fire first
    } catch (const TimeoutError& e) {
      msg = e.what();
    }
    rank0_done = true;
    EXPECT_LT(seconds_since(start), 5.0) << msg;
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("waiting for rank 1 (world rank 1) to contribute segment 1 of"),
              std::string::npos)
        << msg;
  });
}

}  // namespace
}  // namespace tandem
