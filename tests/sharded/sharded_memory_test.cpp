// ShardedDataParallel with ranks as threads: what stages 2 and 3 hold while backward runs. The
// full gradients of a bucket exist only until its reduce-scatter is done: one bucket in flight
// while the next one's gradients arrive; at stage 3 (sharding.backward_prefetch = post) the
// next unit is gathered only after the current one's gradients are in, so a unit's backward
// runs beside one more unit's full gradients at most (the stage-3 peak of
// docs/sharded_data_parallel.md counts on both).
#include "tests/sharded/sharded_test_util.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

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

// What a rank held beyond its shards while backward ran, seen from every parameter's gradient
// hook in the second step, in units of the largest bucket's full gradients (at stage 3 a bucket
// is a unit: its full gradients are as large as its full parameters).
struct Transient {
  double gradients = 0;  // full gradients (buckets in flight, .grad of the parameters)
  double everything = 0;  // + full parameters gathered + the gradient the hook is handed
};

Transient peak_transient_in_buckets(int stage, DistributedDataParallelOptions ddp,
                                    ShardingOptions sharding = {}) {
  std::vector<std::shared_ptr<DeepImpl>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(3);
    models.push_back(std::make_shared<DeepImpl>());
  }
  std::vector<Transient> worst(2);
  sharding.stage = stage;
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    ShardedDataParallel sdp(models[rank], borrow(comm), sharding, ddp);
    int64_t shard_bytes = 0, largest_bucket = 0;
    for (const auto& s : sdp.parameters()) {
      shard_bytes += s.numel() * 4;
      largest_bucket = std::max<int64_t>(largest_bucket, s.numel() * 4 * comm.size());
    }
    std::atomic<bool> observe{false};
    int64_t most_gradients = 0, most = 0;
    for (auto& p : models[rank]->parameters()) {
      p.register_hook([&](const at::Tensor& incoming) {
        if (!observe) return;
        const auto use = sdp.core().memory_use();
        const int64_t gradients = use.gradient_bytes - shard_bytes;
        // Stages 1-2 keep the full parameters anyway: count them from stage 3 on only.
        const int64_t parameters = stage == 3 ? use.parameter_bytes - shard_bytes : 0;
        most_gradients = std::max(most_gradients, gradients);
        most = std::max(most, gradients + parameters + incoming.numel() * 4);
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
    worst[rank] = {static_cast<double>(most_gradients) / static_cast<double>(largest_bucket),
                   static_cast<double>(most) / static_cast<double>(largest_bucket)};
  });
  return {std::max(worst[0].gradients, worst[1].gradients),
          std::max(worst[0].everything, worst[1].everything)};
}

// One bucket in flight plus the gradients of the bucket being filled; without the bound every
// bucket but the last is still alive when the first layer's gradients arrive (7 of 8 here).
TEST(ShardedMemory, Stage3HoldsAtMostTwoBucketsOfFullGradients) {
  EXPECT_LE(peak_transient_in_buckets(3, {}).gradients, 2.0);
}

// "post": the unit computing, its gradients and the previous unit's in flight. "pre" adds the
// next unit, gathered when the current one's backward starts.
TEST(ShardedMemory, Stage3BackwardHoldsThreeUnitsWithPostAndFourWithPrePrefetch) {
  ShardingOptions post, pre;
  post.backward_prefetch = "post";
  pre.backward_prefetch = "pre";
  const double with_post = peak_transient_in_buckets(3, {}, post).everything;
  const double with_pre = peak_transient_in_buckets(3, {}, pre).everything;
  std::printf("beyond the shards, in units: post %.3f, pre %.3f\n", with_post, with_pre);
  EXPECT_LE(with_post, 3.0);
  EXPECT_GT(with_pre, 3.5);
}

TEST(ShardedMemory, Stage2HoldsAtMostTwoBucketsOfFullGradients) {
  DistributedDataParallelOptions one_block;  // buckets of about one block's gradients
  one_block.bucket_cap_mb = 0.009;
  one_block.first_bucket_cap_mb = 0.009;
  EXPECT_LE(peak_transient_in_buckets(2, one_block).gradients, 2.0);
}

// Between steps a stage-3 parameter has no memory: reading it raises an error that names its unit
// and gather_parameters() (it read freed memory before, a SIGSEGV), and after the gather it holds
// the trained values, which the next step trains on as before.
TEST(ShardedMemory, AReshardedParameterReadIsAClearErrorUntilGathered) {
  std::vector<std::shared_ptr<DeepImpl>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(3);
    models.push_back(std::make_shared<DeepImpl>());
  }
  const auto initial = [] {
    torch::manual_seed(3);
    return std::make_shared<DeepImpl>();
  }();
  std::vector<std::string> errors(2);
  std::vector<at::Tensor> gathered(2);
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    ShardingOptions sharding;
    sharding.stage = 3;
    ShardedDataParallel sdp(models[rank], borrow(comm), sharding);
    torch::optim::SGD opt(sdp.parameters(), torch::optim::SGDOptions(0.1));
    const at::Tensor x = at::ones({2, kWidth}) * (rank + 1);
    auto step = [&] {
      opt.zero_grad();
      sdp(x).pow(2).mean().backward();
      opt.step();
    };
    step();
    const at::Tensor weight = models[rank]->blocks[2]->parameters().front();
    try {
      (void)weight.sum();
    } catch (const c10::Error& e) {
      errors[rank] = e.what_without_backtrace();
    }
    sdp.gather_parameters();
    gathered[rank] = weight.detach().clone();
    step();  // trains on as before: the parameters are views of the unit's memory again
    sdp.gather_parameters();
    (void)weight.sum();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("unit 'block2'"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("gather_parameters()"), std::string::npos) << errors[r];
  }
  EXPECT_TRUE(gathered[0].equal(gathered[1]));
  EXPECT_FALSE(gathered[0].equal(initial->blocks[2]->parameters().front())) << "did not train";
}

}  // namespace
}  // namespace tandem::sharded_test
