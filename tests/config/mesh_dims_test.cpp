// Context's mesh (docs/config.md, "Context"): the layout parallel.pp and sharding.* ask of a
// world, its errors naming the keys, and one set of groups shared by the pipeline and
// ShardedDataParallel. Ranks as threads over Gloo.
#include "runtime/sharded/sharded_state.h"
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/context.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

Config with(const std::vector<std::string>& sets) { return load_config({{}, {}, sets}).config; }

std::string layout(const std::vector<MeshDim>& dims) {
  std::string out;
  for (const MeshDim& d : dims) out += (out.empty() ? "" : " ") + d.name + "=" + std::to_string(d.size);
  return out;
}

TEST(MeshDims, ReplicasOutermostThenShardGroupsThenConsecutivePipelineStages) {
  EXPECT_EQ(layout(mesh_dims(with({}), 4)), "dp_replicate=4 dp_shard=1 pp=1");
  EXPECT_EQ(layout(mesh_dims(with({"sharding.stage=3"}), 4)), "dp_replicate=1 dp_shard=4 pp=1");
  EXPECT_EQ(layout(mesh_dims(with({"parallel.pp=2", "sharding.stage=3"}), 8)),
            "dp_replicate=1 dp_shard=4 pp=2");
  EXPECT_EQ(layout(mesh_dims(with({"parallel.pp=2", "sharding.stage=2", "sharding.group_size=2"}), 8)),
            "dp_replicate=2 dp_shard=2 pp=2");
}

TEST(MeshDims, SizesThatDoNotDivideNameTheKeyToSet) {
  EXPECT_NE(testing::config_error_of([] { mesh_dims(with({"parallel.pp=3"}), 4); })
                .find("parallel.pp 3 does not divide the world of 4 ranks; --set parallel.pp=1"),
            std::string::npos);
  const std::string shard = testing::config_error_of([] {
    mesh_dims(with({"parallel.pp=2", "sharding.stage=1", "sharding.group_size=3"}), 8);
  });
  EXPECT_NE(shard.find("sharding.group_size 3 does not divide the 4 data-parallel ranks"),
            std::string::npos) << shard;
  EXPECT_NE(shard.find("--set sharding.group_size=4"), std::string::npos) << shard;
  EXPECT_THROW(load_config({{}, {}, {"parallel.pp=0"}}), InvalidConfigError);
}

TEST(MeshDims, ThePipelineAndShardedDataParallelShareTheMeshsGroups) {
  testing::run_ranks(4, [](Communicator& world) {
    const Config config = with({"parallel.pp=2", "sharding.stage=3"});
    auto mesh = std::make_shared<DeviceMesh>(testing::borrow(world), mesh_dims(config, 4));
    PipelineGroups groups = make_pipeline_groups(*mesh);
    ASSERT_NE(groups.data, nullptr);
    EXPECT_EQ(groups.pipeline->size(), 2);
    EXPECT_EQ(groups.pipeline->rank(), world.rank() % 2);  // consecutive ranks: one pipeline
    EXPECT_EQ(groups.data->size(), 2);
    torch::manual_seed(0);
    auto model = torch::nn::Linear(4, 4);
    ShardedDataParallel sdp(model, mesh, config.sharding, config.ddp);
    auto& s = sdp.core().internal_state();
    EXPECT_EQ(s.world, groups.data);  // the same communicator, not another one over those ranks
    EXPECT_EQ(s.shard_comm, mesh->group({"dp_shard"}, "gather"));
    EXPECT_EQ(s.shard_size(), 2);
    // A mesh laid out for other options is refused, naming both.
    const std::string wrong = testing::config_error_of([&] {
      ShardedDataParallel other(model, mesh, with({"sharding.stage=0"}).sharding, config.ddp);
    });
    EXPECT_NE(wrong.find("shards over 2 ranks, but sharding.stage=0 with sharding.group_size=0 "
                         "asks for 1"), std::string::npos) << wrong;
  });
}

}  // namespace
}  // namespace tandem
