// ShardedDataParallel with ranks as threads: what stages 2 and 3 hold while backward runs. The
// full gradients of a bucket exist only until its reduce-scatter is done: one bucket in flight
// while the next one's gradients arrive (the stage-3 peak of docs/sharded_data_parallel.md counts
// on it).
#include "tests/sharded/sharded_test_util.h"

#include <algorithm>
#include <atomic>

namespace tandem::sharded_test {
namespace {

using testing::run_ranks;

constexpr int kBlocks = 8;

// kBlocks equal blocks, each a ShardedUnit (a unit of its own at stage 3).
struct DeepImpl : torch::nn::Module {
  DeepImpl() {
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(
          register_module("block" + std::to_string(i), ShardedUnit<BlockImpl>(Block())));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x;
  }
  std::vector<ShardedUnit<BlockImpl>> blocks;
};

// Most gradient bytes beyond the persistent gradient shards that a rank held while backward ran
// (seen from every parameter's gradient hook in the second step), in units of the largest
// bucket's full gradients.
double peak_transient_gradients_in_buckets(int stage, DistributedDataParallelOptions ddp) {
  std::vector<std::shared_ptr<DeepImpl>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(3);
    models.push_back(std::make_shared<DeepImpl>());
  }
  std::vector<double> worst(2, 0.0);
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    ShardingOptions sharding;
    sharding.stage = stage;
    ShardedDataParallel sdp(models[rank], borrow(comm), sharding, ddp);
    int64_t shard_bytes = 0, largest_bucket = 0;
    for (const auto& s : sdp.parameters()) {
      shard_bytes += s.numel() * 4;
      largest_bucket = std::max<int64_t>(largest_bucket, s.numel() * 4 * comm.size());
    }
    std::atomic<bool> observe{false};
    int64_t most = 0;
    for (auto& p : models[rank]->parameters()) {
      p.register_hook([&](const at::Tensor&) {
        if (observe) most = std::max(most, sdp.core().memory_use().gradient_bytes - shard_bytes);
      });
    }
    torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      observe = step == 1;  // the gradient shards exist from the first backward on
      opt.zero_grad();
      auto gen = at::detail::createCPUGenerator(1000 + 97 * static_cast<uint64_t>(rank) + step);
      const at::Tensor x = at::randn({6, kWidth}, gen), y = at::randn({6, kWidth}, gen);
      torch::mse_loss(sdp(x), y).backward();
      opt.step();
    }
    worst[rank] = static_cast<double>(most) / static_cast<double>(largest_bucket);
  });
  return *std::max_element(worst.begin(), worst.end());
}

// One bucket in flight plus the gradients of the bucket being filled; without the bound every
// bucket but the last is still alive when the first layer's gradients arrive (7 of 8 here).
TEST(ShardedMemory, Stage3HoldsAtMostTwoBucketsOfFullGradients) {
  EXPECT_LE(peak_transient_gradients_in_buckets(3, {}), 2.0);
}

TEST(ShardedMemory, Stage2HoldsAtMostTwoBucketsOfFullGradients) {
  DistributedDataParallelOptions one_block;  // buckets of about one block's gradients
  one_block.bucket_cap_mb = 0.009;
  one_block.first_bucket_cap_mb = 0.009;
  EXPECT_LE(peak_transient_gradients_in_buckets(2, one_block), 2.0);
}

}  // namespace
}  // namespace tandem::sharded_test
