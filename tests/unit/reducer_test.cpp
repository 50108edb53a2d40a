// Reducer on its own: the pure bucket planner and plan check, argument checks, and averaging of
// plain leaf tensors with ranks as threads (world sizes 1-4).
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/reducer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace tandem {
namespace {

using testing::run_ranks;
using Plan = std::vector<std::vector<int64_t>>;

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::vector<int64_t> reversed(int64_t n) {
  std::vector<int64_t> v = iota(n);
  std::reverse(v.begin(), v.end());
  return v;
}

// ---------------------------------------------------------------------------------------------
// plan_buckets

TEST(PlanBuckets, EmptyOrderGivesNoBuckets) {
  EXPECT_TRUE(plan_buckets({}, {}, {}, 100, 100).empty());
}

TEST(PlanBuckets, FirstBucketHasItsOwnSmallerCap) {
  const std::vector<at::ScalarType> dtypes(6, at::kFloat);
  const std::vector<int64_t> bytes(6, 100);
  // Reverse registration order; the first bucket closes at 150 bytes, the others at 300.
  EXPECT_EQ(plan_buckets(reversed(6), dtypes, bytes, 150, 300), (Plan{{5, 4}, {3, 2, 1}, {0}}));
}

TEST(PlanBuckets, ABucketClosesWhenItReachesTheCapExactly) {
  const std::vector<at::ScalarType> dtypes(6, at::kFloat);
  const std::vector<int64_t> bytes(6, 100);
  EXPECT_EQ(plan_buckets(iota(6), dtypes, bytes, 100, 300), (Plan{{0}, {1, 2, 3}, {4, 5}}));
}

TEST(PlanBuckets, AParameterLargerThanTheCapSitsAlone) {
  const std::vector<at::ScalarType> dtypes(4, at::kFloat);
  EXPECT_EQ(plan_buckets(iota(4), dtypes, {10, 1000, 10, 10}, 50, 50),
            (Plan{{0, 1}, {2, 3}}));
  EXPECT_EQ(plan_buckets(iota(4), dtypes, {1000, 10, 10, 1000}, 50, 50),
            (Plan{{0}, {1, 2, 3}}));
}

TEST(PlanBuckets, BucketsHoldOneDtypeAndEachDtypeHasItsOwnFirstBucket) {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble, at::kFloat,
                                              at::kDouble, at::kFloat, at::kDouble, at::kHalf};
  const std::vector<int64_t> bytes(7, 100);
  // Float: {0, 2} reaches the first cap, {4} is left open. Double: {1, 3}, then {5}. Half: {6}.
  // Launch order: by the position of each bucket's first parameter in `order`.
  EXPECT_EQ(plan_buckets(iota(7), dtypes, bytes, 150, 1000),
            (Plan{{0, 2}, {1, 3}, {4}, {5}, {6}}));
  // In reverse order, the half parameter comes first and so does its bucket.
  EXPECT_EQ(plan_buckets(reversed(7), dtypes, bytes, 150, 1000),
            (Plan{{6}, {5, 3}, {4, 2}, {1}, {0}}));
}

TEST(PlanBuckets, FollowsTheGivenOrderNotTheIndices) {
  const std::vector<at::ScalarType> dtypes(5, at::kFloat);
  const std::vector<int64_t> bytes = {8, 8, 8, 8, 8};
  EXPECT_EQ(plan_buckets({3, 0, 4, 2, 1}, dtypes, bytes, 1 << 20, 1 << 20),
            (Plan{{3, 0, 4, 2, 1}}));
  EXPECT_EQ(plan_buckets({3, 0, 4, 2, 1}, dtypes, bytes, 16, 16),
            (Plan{{3, 0}, {4, 2}, {1}}));
}

TEST(PlanBuckets, EveryParameterLandsInExactlyOneBucket) {
  const int64_t n = 50;
  std::vector<at::ScalarType> dtypes;
  std::vector<int64_t> bytes;
  for (int64_t i = 0; i < n; ++i) {
    dtypes.push_back(i % 3 == 0 ? at::kDouble : at::kFloat);
    bytes.push_back(4 * (1 + (i * 37) % 23));
  }
  std::vector<int64_t> order = iota(n);
  std::rotate(order.begin(), order.begin() + 17, order.end());
  const Plan plan = plan_buckets(order, dtypes, bytes, 20, 60);
  std::vector<int> seen(n, 0);
  std::vector<int64_t> position(n);
  for (int64_t i = 0; i < n; ++i) position[order[i]] = i;
  int64_t last_front = -1;
  for (const auto& bucket : plan) {
    ASSERT_FALSE(bucket.empty());
    EXPECT_GT(position[bucket.front()], last_front) << "buckets out of launch order";
    last_front = position[bucket.front()];
    for (size_t k = 0; k < bucket.size(); ++k) {
      ++seen[bucket[k]];
      EXPECT_EQ(dtypes[bucket[k]], dtypes[bucket.front()]);
      if (k > 0) {
        EXPECT_GT(position[bucket[k]], position[bucket[k - 1]]);
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "parameter " << i;
}

TEST(PlanBuckets, ReverseRegistrationOrder) {
  EXPECT_EQ(reverse_registration_order(4), reversed(4));
  EXPECT_TRUE(reverse_registration_order(0).empty());
}

// check_bucket_plan: what a plan read back from a checkpoint must satisfy.
TEST(CheckBucketPlan, AcceptsPlansTheReducerMakesAndNamesWhatIsWrongOtherwise) {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kFloat, at::kDouble};
  const std::vector<std::string> names = {"a", "b", "c"};
  EXPECT_NO_THROW(
      check_bucket_plan(plan_buckets(reversed(3), dtypes, {4, 4, 8}, 4, 8), dtypes, names));
  const auto error = [&](const Plan& plan) -> std::string {
    try {
      check_bucket_plan(plan, dtypes, names);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error({{0, 1}, {2}, {1}}).find("bucket 2 lists parameter 1, which is out of range (the "
                                           "model has 3) or already in a bucket"),
            std::string::npos);
  EXPECT_NE(error({{0, 1}, {2, 3}}).find("bucket 1 lists parameter 3"), std::string::npos);
  EXPECT_NE(error({{0, 2}, {1}}).find("bucket 0 mixes dtypes (parameter 'c')"), std::string::npos);
  EXPECT_NE(error({{0, 1}, {}, {2}}).find("bucket 1 is empty"), std::string::npos);
  EXPECT_NE(error({{0, 1}}).find("parameter 'c' is in no bucket"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Reducer

std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

TEST(Reducer, RejectsBadArguments) {
  run_ranks(1, [](Communicator& comm) {
    auto p = at::zeros({3}).requires_grad_();
    EXPECT_THROW(Reducer({p}, {"a", "b"}, borrow(comm), {}), ConfigError);
    EXPECT_THROW(Reducer({p}, {"a"}, nullptr, {}), ConfigError);
    EXPECT_THROW(Reducer({p * 2}, {"not_a_leaf"}, borrow(comm), {}), ConfigError);
    EXPECT_THROW(Reducer({at::zeros({3})}, {"no_grad"}, borrow(comm), {}), ConfigError);
    DistributedDataParallelOptions bad;
    bad.first_bucket_cap_mb = -1;
    EXPECT_THROW(Reducer({p}, {"a"}, borrow(comm), bad), ConfigError);
    try {
      Reducer({p * 2}, {"layer.weight"}, borrow(comm), {});
      ADD_FAILURE() << "no error for a non-leaf parameter";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("layer.weight"), std::string::npos) << e.what();
    }
  });
}

TEST(Reducer, LoadsASavedBucketPlanAndRejectsOnesThatDoNotFit) {
  run_ranks(1, [](Communicator& comm) {
    auto a = at::zeros({3}).requires_grad_();
    auto b = at::zeros({4}).requires_grad_();
    auto c = at::zeros({2}, at::kDouble).requires_grad_();
    Reducer reducer({a, b, c}, {"a", "b", "c"}, borrow(comm), {});
    using Plan = std::vector<std::vector<int64_t>>;
    for (const Plan& bad : {Plan{{0, 1}}, Plan{{0, 1}, {2}, {1}}, Plan{{0, 1, 3}, {2}},
                            Plan{{0, 2}, {1}}, Plan{{0, 1}, {}, {2}}}) {
      EXPECT_THROW(reducer.load_bucket_plan(bad), ConfigError);
    }
    EXPECT_FALSE(reducer.buckets_rebuilt());
    reducer.load_bucket_plan({{2}, {1, 0}});
    EXPECT_EQ(reducer.bucket_plan(), (Plan{{2}, {1, 0}}));
    EXPECT_TRUE(reducer.buckets_rebuilt());  // no rebuild after the first step any more
  });
}

class ReducerWorlds : public ::testing::TestWithParam<int> {};

// loss = sum(a * (rank + 1)) + sum(b * 2 (rank + 1)): the gradients are small integers whose
// average is exact in both dtypes.
TEST_P(ReducerWorlds, ArmedBackwardAveragesPlainLeafTensorsExactly) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    auto a = at::zeros({3, 5}).requires_grad_();
    auto b = at::zeros({7}, at::kDouble).requires_grad_();
    DistributedDataParallelOptions options;
    options.first_bucket_cap_mb = 1e-6;
    options.bucket_cap_mb = 1e-6;
    Reducer reducer({a, b}, {"a", "b"}, borrow(comm), options);
    EXPECT_EQ(reducer.parameter_names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(reducer.bucket_plan(), (Plan{{1}, {0}}));
    EXPECT_EQ(reducer.codec().name(), "average");
    const double mean = (world + 1) / 2.0;
    for (int step = 0; step < 3; ++step) {
      reducer.prepare_for_forward();
      auto loss = (a * double(comm.rank() + 1)).sum() + (b * 2.0 * (comm.rank() + 1)).sum();
      reducer.prepare_for_backward({loss});
      loss.backward();
      EXPECT_TRUE(at::equal(a.grad(), at::full({3, 5}, mean))) << "step " << step;
      EXPECT_TRUE(at::equal(b.grad(), at::full({7}, 2 * mean, at::kDouble))) << "step " << step;
      EXPECT_GE(reducer.last_overlap_seconds(), 0.0);
      EXPECT_GE(reducer.last_wait_seconds(), 0.0);
      a.mutable_grad() = at::Tensor();
      b.mutable_grad() = at::Tensor();
    }
    EXPECT_TRUE(reducer.buckets_rebuilt());
  });
}

TEST_P(ReducerWorlds, UnarmedBackwardKeepsLocalGradients) {
  const int world = GetParam();
  run_ranks(world, [&](Communicator& comm) {
    auto a = at::zeros({4}).requires_grad_();
    Reducer reducer({a}, {"a"}, borrow(comm), {});
    reducer.prepare_for_forward();
    (a * double(comm.rank() + 1)).sum().backward();  // no prepare_for_backward: not armed
    EXPECT_TRUE(at::equal(a.grad(), at::full({4}, double(comm.rank() + 1))));
    // Accumulation mode records only; the next armed backward reduces the accumulated sum.
    reducer.prepare_for_forward();
    reducer.prepare_for_accumulation();
    (a * 1.0).sum().backward();
    EXPECT_TRUE(at::equal(a.grad(), at::full({4}, double(comm.rank() + 2))));
    reducer.prepare_for_forward();
    auto loss = (a * 1.0).sum();
    reducer.prepare_for_backward({loss});
    loss.backward();
    // Mean over ranks of (rank + 3).
    EXPECT_TRUE(at::equal(a.grad(), at::full({4}, (world - 1) / 2.0 + 3)));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReducerWorlds, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem
