// Every collective x dtype x world size 1-4 against a reference computed locally, with ranks as
// threads over one HashStore.
#include "tests/support/test_support.h"

#include <tandem/collectives/communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace tandem {
namespace {

using testing::run_ranks;

const auto& kDtypes = testing::kAllDtypes;
const auto& kOps = testing::kAllReduceOps;

// Small integers, so sums and products are exact in every dtype (int8 and bfloat16 included).
at::Tensor input_for(int rank, int64_t n, at::ScalarType dtype, ReduceOp op) {
  const auto i = at::arange(n, at::kLong);
  const auto v = op == ReduceOp::kProduct ? (i + rank) % 2 + 1 : (i * 7 + rank * 3) % 5 + 1;
  return v.to(dtype);
}

at::Tensor reference(int world, int64_t n, at::ScalarType dtype, ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(input_for(r, n, dtype, op).to(at::kDouble));
  const auto s = at::stack(all);
  switch (op) {
    case ReduceOp::kSum: return s.sum(0).to(dtype);
    case ReduceOp::kAvg: return s.mean(0).to(dtype);
    case ReduceOp::kMin: return std::get<0>(s.min(0)).to(dtype);
    case ReduceOp::kMax: return std::get<0>(s.max(0)).to(dtype);
    case ReduceOp::kProduct: return s.prod(0).to(dtype);
  }
  return {};
}

void expect_matches(const at::Tensor& got, const at::Tensor& want, ReduceOp op,
                    const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  if (op == ReduceOp::kAvg) {
    // avg = exact sum, then one division rounded in the dtype: within half an ulp of the dtype.
    const double rtol = want.element_size() == 2 ? 1e-2 : 1e-6;
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), want.to(at::kDouble), rtol, 0)) << what;
  } else {
    EXPECT_TRUE(at::equal(got, want)) << what << "\n got " << got.slice(0, 0, 8)
                                      << "\n want " << want.slice(0, 0, 8);
  }
}

std::string label(const char* op, at::ScalarType dtype, int64_t n, int rank) {
  return std::string(op) + " " + c10::toString(dtype) + " n=" + std::to_string(n) + " rank " +
         std::to_string(rank);
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllreduceEveryOpAndDtype) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    // 1000 elements take the small-message algorithm, 70000 (>= 70 KiB) the ring.
    for (int64_t n : {0, 1, 1000, 70000}) {
      for (auto dtype : kDtypes) {
        for (auto op : kOps) {
          if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
          auto t = input_for(comm.rank(), n, dtype, op);
          comm.allreduce(t, op)->wait();
          expect_matches(t, reference(world, n, dtype, op), op,
                         label(to_string(op), dtype, n, comm.rank()));
        }
      }
    }
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    for (auto dtype : kDtypes) {
      for (int root = 0; root < world; ++root) {
        auto t = input_for(comm.rank(), 3001, dtype, ReduceOp::kSum);
        comm.broadcast(t, root)->wait();
        EXPECT_TRUE(at::equal(t, input_for(root, 3001, dtype, ReduceOp::kSum)))
            << label("broadcast", dtype, 3001, comm.rank()) << " root " << root;
      }
    }
  });
}

TEST_P(Collectives, AllgatherEveryDtype) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    for (auto dtype : kDtypes) {
      const int64_t n = 777;
      auto in = input_for(comm.rank(), n, dtype, ReduceOp::kSum);
      auto out = at::zeros({world * n}, dtype);
      comm.allgather(out, in)->wait();
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(at::equal(out.slice(0, r * n, (r + 1) * n),
                              input_for(r, n, dtype, ReduceOp::kSum)))
            << label("allgather", dtype, n, comm.rank()) << " slice " << r;
      }
    }
  });
}

TEST_P(Collectives, ReduceScatterEveryOpAndDtype) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    for (int64_t n : {1, 513}) {
      for (auto dtype : kDtypes) {
        for (auto op : kOps) {
          if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
          auto in = input_for(comm.rank(), world * n, dtype, op);
          auto out = at::zeros({n}, dtype);
          comm.reduce_scatter(out, in, op)->wait();
          auto want = reference(world, world * n, dtype, op).slice(0, comm.rank() * n,
                                                                   (comm.rank() + 1) * n);
          expect_matches(out, want, op, label("reduce_scatter", dtype, n, comm.rank()));
        }
      }
    }
  });
}

TEST_P(Collectives, NonContiguousTensorsAreCopiedBack) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    const double r = comm.rank();
    // Transposed matrix: allreduce result lands in the caller's strided tensor.
    auto base = at::arange(12, at::kFloat).reshape({3, 4}) + r;
    auto t = base.t();
    ASSERT_FALSE(t.is_contiguous());
    comm.allreduce(t, ReduceOp::kSum)->wait();
    const double rank_sum = world * (world - 1) / 2.0;
    EXPECT_TRUE(at::equal(base, at::arange(12, at::kFloat).reshape({3, 4}) * world + rank_sum));
    // Strided slice as broadcast target; neighbours untouched.
    auto host = at::full({10}, -1.0f);
    auto every_other = host.slice(0, 0, 10, 2);
    every_other.fill_(static_cast<float>(r));
    comm.broadcast(every_other, world - 1)->wait();
    EXPECT_TRUE(at::equal(host.slice(0, 0, 10, 2), at::full({5}, float(world - 1))));
    EXPECT_TRUE(at::equal(host.slice(0, 1, 10, 2), at::full({5}, -1.0f)));
    // Non-contiguous allgather input and output.
    auto in = (at::arange(8, at::kInt).reshape({2, 4}) + comm.rank()).t();
    auto out_host = at::zeros({world * 8, 2}, at::kInt);
    auto out = out_host.select(1, 0);
    comm.allgather(out, in)->wait();
    for (int k = 0; k < world; ++k) {
      auto want = (at::arange(8, at::kInt).reshape({2, 4}) + k).t().reshape({-1});
      EXPECT_TRUE(at::equal(out.slice(0, k * 8, (k + 1) * 8), want)) << "slice " << k;
    }
    EXPECT_TRUE(at::equal(out_host.select(1, 1), at::zeros({world * 8}, at::kInt)));
  });
}

TEST_P(Collectives, AsyncOpsCompleteInIssueOrder) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    std::vector<at::Tensor> tensors;
    std::vector<WorkPtr> works;
    for (int i = 0; i < 20; ++i) {
      tensors.push_back(at::full({1000 + i}, float(i + comm.rank())));
      works.push_back(comm.allreduce(tensors.back(), ReduceOp::kMax));
    }
    for (int i = 19; i >= 0; --i) works[i]->wait();  // waiting out of order is fine
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(works[i]->is_completed());
      EXPECT_TRUE(at::equal(tensors[i], at::full({1000 + i}, float(i + world - 1))));
    }
    comm.barrier()->wait();
  });
}

TEST_P(Collectives, SendRecvMatchInPostingOrderPerTag) {
  const int world = GetParam();
  if (world < 2) GTEST_SKIP() << "point-to-point needs two ranks";
  run_ranks(world, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<WorkPtr> sends;
      std::vector<at::Tensor> keep;
      for (int i = 0; i < 5; ++i) {
        keep.push_back(at::full({100}, float(i)));
        sends.push_back(comm.send(keep.back(), 1, /*tag=*/7));
      }
      keep.push_back(at::full({3}, 111.0f));
      sends.push_back(comm.send(keep.back(), 1, /*tag=*/1));
      keep.push_back(at::full({3}, 222.0f));
      sends.push_back(comm.send(keep.back(), 1, /*tag=*/2));
      for (auto& w : sends) w->wait();
    } else if (comm.rank() == 1) {
      // Tag 2 posted before tag 1: matching is by tag, not by arrival.
      auto t2 = at::zeros({3});
      auto t1 = at::zeros({3});
      auto w2 = comm.recv(t2, 0, 2);
      auto w1 = comm.recv(t1, 0, 1);
      std::vector<at::Tensor> got;
      std::vector<WorkPtr> recvs;
      for (int i = 0; i < 5; ++i) {
        got.push_back(at::zeros({100}));
        recvs.push_back(comm.recv(got.back(), 0, 7));
      }
      for (int i = 4; i >= 0; --i) recvs[i]->wait();
      for (int i = 0; i < 5; ++i) EXPECT_TRUE(at::equal(got[i], at::full({100}, float(i))));
      w1->wait();
      w2->wait();
      EXPECT_TRUE(at::equal(t1, at::full({3}, 111.0f)));
      EXPECT_TRUE(at::equal(t2, at::full({3}, 222.0f)));
    }
    // Ring exchange: everyone sends right and receives from the left at once (no deadlock).
    const int right = (comm.rank() + 1) % world;
    const int left = (comm.rank() + world - 1) % world;
    auto out = at::full({4096}, float(comm.rank()));
    auto in = at::zeros({4096, 2}).select(1, 0);  // non-contiguous receive buffer
    auto s = comm.send(out, right, 3);
    auto r = comm.recv(in, left, 3);
    s->wait();
    r->wait();
    EXPECT_TRUE(at::equal(in, at::full({4096}, float(left))));
    comm.barrier()->wait();
  });
}

TEST_P(Collectives, SubGroupsFromNewGroupAndSplit) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    std::vector<int> evens;
    for (int r = 0; r < world; r += 2) evens.push_back(r);
    auto group = comm.new_group(evens);
    if (comm.rank() % 2 == 0) {
      ASSERT_NE(group, nullptr);
      EXPECT_EQ(group->size(), static_cast<int>(evens.size()));
      EXPECT_EQ(group->rank(), comm.rank() / 2);
      EXPECT_EQ(group->world_rank(group->rank()), comm.rank());
      auto t = at::full({5}, float(comm.rank()));
      group->allreduce(t, ReduceOp::kSum)->wait();
      float want = 0;
      for (int r : evens) want += r;
      EXPECT_TRUE(at::equal(t, at::full({5}, want)));
    } else {
      EXPECT_EQ(group, nullptr);
    }
    // split by parity, keyed by -rank: group rank 0 is the highest world rank of the colour.
    auto half = comm.split(comm.rank() % 2, -comm.rank());
    ASSERT_NE(half, nullptr);
    int members = 0, higher = 0;
    for (int r = comm.rank() % 2; r < world; r += 2) {
      ++members;
      if (r > comm.rank()) ++higher;
    }
    EXPECT_EQ(half->size(), members);
    EXPECT_EQ(half->rank(), higher);
    auto t = at::full({1}, float(comm.rank()));
    auto order = at::zeros({members});
    half->allgather(order, t)->wait();
    for (int i = 0; i + 1 < members; ++i) {
      EXPECT_GT(order[i].item<float>(), order[i + 1].item<float>());
    }
    // Opting out with a negative colour.
    auto none = comm.split(comm.rank() == 0 ? -1 : 0, 0);
    EXPECT_EQ(none == nullptr, comm.rank() == 0);
    comm.barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem
