// DeviceMesh: row-major coordinates, groups over named dimensions (made once per lane), and
// errors that name the dimensions. Ranks as threads over Gloo.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/device_mesh.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

using testing::borrow;

// The sum over a group of each member's world rank: says which ranks it holds.
double sum_of_world_ranks(Communicator& group, int world_rank) {
  auto t = torch::full({1}, static_cast<double>(world_rank), torch::kFloat64);
  group.allreduce(t, ReduceOp::kSum)->wait();
  return t.item<double>();
}

TEST(DeviceMesh, CoordinatesAreRowMajorAndGroupsHoldTheRanksThatDifferOnlyThere) {
  testing::run_ranks(4, [&](Communicator& world) {
    DeviceMesh mesh(borrow(world), {{"dp", 2}, {"tp", 2}});
    const int r = world.rank();
    EXPECT_EQ(mesh.coordinate("dp"), r / 2);
    EXPECT_EQ(mesh.coordinate("tp"), r % 2);
    EXPECT_EQ(mesh.size("tp"), 2);
    // tp: consecutive ranks; dp: ranks two apart; both: everyone; none: this rank alone.
    EXPECT_EQ(mesh.group_ranks({"tp"}), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(mesh.group_ranks({"dp"}), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_EQ(mesh.group_ranks({"tp", "dp"}), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(mesh.group_ranks({}), (std::vector<int>{r}));
    auto tp = mesh.group({"tp"});
    auto dp = mesh.group({"dp"});
    auto all = mesh.group({"dp", "tp"});
    auto self = mesh.group({});
    ASSERT_NE(tp, nullptr);
    ASSERT_NE(self, nullptr);
    EXPECT_EQ(tp->size(), 2);
    EXPECT_EQ(tp->rank(), r % 2);  // group rank = position along the dimension
    EXPECT_EQ(dp->rank(), r / 2);
    EXPECT_EQ(all.get(), &world);  // every rank, on the default lane: the world itself
    EXPECT_EQ(self->size(), 1);
    EXPECT_EQ(sum_of_world_ranks(*tp, r), r / 2 * 4 + 1);  // {0,1} or {2,3}
    EXPECT_EQ(sum_of_world_ranks(*dp, r), r % 2 * 2 + 2);  // {0,2} or {1,3}
    EXPECT_EQ(sum_of_world_ranks(*all, r), 6);
    EXPECT_EQ(mesh.describe().find("dp=2 x tp=2 (this rank: dp "), 0u) << mesh.describe();
  });
}

TEST(DeviceMesh, AGroupIsMadeOncePerLaneAndLanesAreSeparateCommunicators) {
  testing::run_ranks(2, [&](Communicator& world) {
    DeviceMesh mesh(borrow(world), {{"dp_replicate", 1}, {"dp_shard", 2}});
    auto gather = mesh.group({"dp_shard"}, "gather");
    auto reduce = mesh.group({"dp_shard"}, "reduce");
    EXPECT_EQ(mesh.group({"dp_shard"}, "gather"), gather);
    EXPECT_NE(gather, reduce);
    // Ops on one lane do not wait for the other's: each has its own order.
    auto a = torch::ones({4});
    auto b = torch::ones({4});
    WorkPtr first = reduce->allreduce(a, ReduceOp::kSum);
    WorkPtr second = gather->allreduce(b, ReduceOp::kSum);
    second->wait();
    first->wait();
    EXPECT_TRUE(a.equal(torch::full({4}, 2.0)));
    EXPECT_TRUE(b.equal(torch::full({4}, 2.0)));
  });
}

void expect_config_error(const std::function<void()>& f, const std::string& needle);

TEST(DeviceMesh, RebuiltOverANewWorldKeepsTheInnerDimensionsAndResizesTheReplicas) {
  testing::run_ranks(4, [&](Communicator& world) {
    DeviceMesh mesh(borrow(world), {{"dp_replicate", 2}, {"dp_shard", 2}});
    // A next epoch of two survivors: ranks 0 and 1 of the old world, in order.
    std::shared_ptr<Communicator> survivors = world.split(world.rank() < 2 ? 0 : 1, world.rank());
    auto next = mesh.rebuilt(survivors);
    ASSERT_EQ(next->dims().size(), 2u);
    EXPECT_EQ(next->size("dp_replicate"), 1);
    EXPECT_EQ(next->size("dp_shard"), 2);
    EXPECT_EQ(next->coordinate("dp_shard"), world.rank() % 2);
    EXPECT_EQ(next->world(), survivors);
    auto shard = next->group({"dp_shard"}, "gather");
    EXPECT_EQ(shard->size(), 2);
    EXPECT_EQ(sum_of_world_ranks(*shard, survivors->rank()), 1);  // new world ranks 0 and 1
    // One survivor cannot hold a shard group of two.
    std::shared_ptr<Communicator> alone = world.split(world.rank(), 0);
    expect_config_error([&] { mesh.rebuilt(alone); },
                        "a new world of 1 ranks cannot keep the inner dimensions (2 ranks each); "
                        "only 'dp_replicate' may change size");
  });
}

void expect_config_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one saying: " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DeviceMesh, BadLayoutsAndUnknownDimensionsAreConfigErrorsThatNameThem) {
  testing::run_ranks(2, [&](Communicator& world) {
    auto w = borrow(world);
    expect_config_error([&] { DeviceMesh(w, {{"dp", 2}, {"tp", 2}}); },
                        "DeviceMesh dp=2 x tp=2 holds 4 ranks, but the world has 2");
    expect_config_error([&] { DeviceMesh(w, {{"dp", 2}, {"dp", 1}}); }, "dimension 'dp' appears twice");
    expect_config_error([&] { DeviceMesh(w, {{"dp", 2}, {"tp", 0}}); }, "'tp' has size 0");
    expect_config_error([&] { DeviceMesh(w, {{"", 2}}); }, "a dimension has no name");
    expect_config_error([&] { DeviceMesh(nullptr, {{"dp", 1}}); }, "world communicator is null");
    DeviceMesh mesh(w, {{"dp", 2}});
    expect_config_error([&] { mesh.size("pp"); }, "has no dimension 'pp'; its dimensions are: dp.");
    expect_config_error([&] { mesh.group({"dp", "dp"}); }, "dimension 'dp' is named twice");
  });
}

}  // namespace
}  // namespace tandem
