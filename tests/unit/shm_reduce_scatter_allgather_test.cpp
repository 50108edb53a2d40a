// Reduce-scatter and all-gather through shared memory (collectives/shm/shm_collectives.h): every
// dtype and op across many pipeline steps, against the TCP path and float64; each rank's
// reduce-scatter chunk bitwise equal to the shared-memory allreduce's (one reduction order for
// DDP and sharding); inputs and outputs that alias; ops of all three kinds issued back to back
// without waiting, from ranks whose timing differs (the two ops that end without a final wait);
// ranks that issue different ops fail at once.
#include "tests/support/test_support.h"
#include "tests/unit/shm_test_util.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>

namespace tandem {
namespace {

using namespace std::chrono_literals;
using namespace shm_test;
using testing::run_threads;

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

class ShmReduceScatterAllgather : public ::testing::TestWithParam<int> {};

// 4 KiB slots: a reduce-scatter step carries 4096 / world bytes per rank (cache-line rounded),
// so the larger sizes take many steps through both buffers.
TEST_P(ShmReduceScatterAllgather, EveryDtypeAndOpAcrossManySegments) {
  const int world = GetParam();
  const std::vector<int64_t> sizes = {0, 1, 2, 17, 1023, 1025, 3 * 4096 + 5};
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto shm = connect_gloo(store, rank, world, shm_options(4096));
    auto tcp = connect_gloo(store, rank, world, tcp_options());
    for (int64_t n : sizes) {
      for (auto dtype : testing::kAllDtypes) {
        for (auto op : testing::kAllReduceOps) {
          if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
          const std::string what = label(dtype, op, n, rank);
          const auto in = input_for(rank, world * n, dtype, op);
          auto out = at::full({n}, 77, dtype);
          auto out_tcp = at::zeros({n}, dtype);
          auto all = in.clone();
          shm->reduce_scatter(out, in, op)->wait();
          tcp->reduce_scatter(out_tcp, in, op)->wait();
          shm->allreduce(all, op)->wait();
          const auto [want, scale] = reference(world, world * n, dtype, op);
          const auto mine = [&, n = n](const at::Tensor& t) { return t.narrow(0, rank * n, n); };
          EXPECT_TRUE(bitwise_equal(out, mine(all).contiguous())) << what << " (vs allreduce)";
          expect_close(out, out_tcp, mine(scale), world, dtype, op, what + " (shm vs tcp)");
          expect_close(out, mine(want), mine(scale), world, dtype, op, what + " (vs float64)");
        }
        // All-gather: exact, every rank's input in rank order.
        const auto piece = input_for(rank, n, dtype, ReduceOp::kSum);
        auto gathered = at::full({world * n}, 77, dtype);
        shm->allgather(gathered, piece)->wait();
        for (int q = 0; q < world; ++q) {
          EXPECT_TRUE(at::equal(gathered.narrow(0, q * n, n), input_for(q, n, dtype, ReduceOp::kSum)))
              << "allgather " << c10::toString(dtype) << " n=" << n << " slice " << q;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmReduceScatterAllgather, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// In place: a reduce-scatter into this rank's chunk of its own input, and all-gathers whose input
// is this rank's chunk of the output or another rank's chunk (read before it is overwritten).
TEST(ShmReduceScatterAllgather, AliasedInputsAndOutputs) {
  const int world = 3;
  const int64_t n = 5000;  // several steps with 4 KiB slots
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, world, shm_options(4096));
    auto value = [](int r) { return at::arange(n, at::kFloat) * 0.5f + r; };

    auto buf = at::cat({value(0), value(1), value(2)}) + rank;
    auto want = at::cat({value(0), value(1), value(2)}) * world + 3;  // + 0 + 1 + 2
    comm->reduce_scatter(buf.narrow(0, rank * n, n), buf)->wait();
    EXPECT_TRUE(at::equal(buf.narrow(0, rank * n, n), want.narrow(0, rank * n, n)));

    auto out = at::zeros({world * n});
    out.narrow(0, rank * n, n).copy_(value(rank));
    comm->allgather(out, out.narrow(0, rank * n, n))->wait();
    EXPECT_TRUE(at::equal(out, at::cat({value(0), value(1), value(2)})));

    auto out2 = at::zeros({world * n});
    out2.narrow(0, 0, n).copy_(value(rank));  // every rank's input sits at chunk 0
    comm->allgather(out2, out2.narrow(0, 0, n))->wait();
    EXPECT_TRUE(at::equal(out2, at::cat({value(0), value(1), value(2)})));
  });
}

// Reduce-scatter and all-gather end without waiting for the peers; a rank may start its next op
// while a peer still reads the last one. Ops of every kind, issued without waiting in between,
// with random pauses that differ per rank, must all come out right.
TEST(ShmReduceScatterAllgather, BackToBackOpsFromRanksOutOfStep) {
  const int world = 3;
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, world, shm_options(4096));
    std::mt19937 rng(1234 + rank);
    std::uniform_int_distribution<int> pause_us(0, 300);
    for (int round = 0; round < 150; ++round) {
      const int64_t n = 1 + (round * 37) % 700;  // one to a few steps
      auto in = at::arange(world * n, at::kFloat) + rank + round;
      auto rs_sum = at::empty({n});
      auto rs_max = at::empty({n});
      auto piece = at::full({n}, float(rank * 1000 + round));
      auto ag = at::empty({world * n});
      auto ar = at::full({7}, float(rank + round));
      std::vector<WorkPtr> works;
      works.push_back(comm->reduce_scatter(rs_sum, in));
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng)));
      works.push_back(comm->allgather(ag, piece));
      works.push_back(comm->reduce_scatter(rs_max, in, ReduceOp::kMax));
      works.push_back(comm->allreduce(ar));
      for (auto& w : works) w->wait();
      const auto mine = at::arange(rank * n, (rank + 1) * n, at::kFloat);
      EXPECT_TRUE(at::equal(rs_sum, mine * world + 3 + world * round)) << "round " << round;
      EXPECT_TRUE(at::equal(rs_max, mine + (world - 1) + round)) << "round " << round;
      for (int q = 0; q < world; ++q) {
        EXPECT_TRUE(at::equal(ag.narrow(0, q * n, n), at::full({n}, float(q * 1000 + round))))
            << "round " << round << " slice " << q;
      }
      EXPECT_TRUE(at::equal(ar, at::full({7}, float(3 + 3 * round)))) << "round " << round;
    }
  });
}

// Same sequence number and bytes, different kinds: a CommError naming both ops on every rank.
TEST(ShmReduceScatterAllgather, DifferentOpsFailAtOnceOnEveryRank) {
  run_threads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, 2, shm_options(4096, 60s));
    const auto start = Clock::now();
    std::string msg;
    try {
      if (rank == 0) {
        auto out = at::zeros({100});
        comm->reduce_scatter(out, at::ones({200}))->wait();
      } else {
        auto out = at::zeros({400});
        comm->allgather(out, at::ones({200}))->wait();
      }
    } catch (const CommError& e) {
      msg = e.what();
    }
    EXPECT_LT(seconds_since(start), 10.0);
    EXPECT_NE(msg.find("different collectives"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reduce_scatter #0 (sum, 800 B float32)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allgather #0 (800 B float32)"), std::string::npos) << msg;
  });
}

}  // namespace
}  // namespace tandem
