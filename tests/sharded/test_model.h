// The model and data of the ShardedDataParallel tests (threads and processes): a small residual
// network whose blocks are ShardedUnits, and per-rank batches independent of the global generator.
#pragma once

#include <tandem/runtime/activation_checkpoint.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::sharded_test {

constexpr int64_t kWidth = 24;

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kWidth, 2 * kWidth));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kWidth, kWidth));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

// in -> 3 blocks (ShardedUnits) -> out; `checkpointed` runs each block under activation
// checkpointing; `unused` adds a layer no forward uses.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool checkpointed = false, bool unused = false, int block_count = 3)
      : checkpointed_(checkpointed) {
    in = register_module("in", torch::nn::Linear(10, kWidth));
    for (int i = 0; i < block_count; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       ShardedUnit<BlockImpl>(Block())));
    }
    out = register_module("out", torch::nn::Linear(kWidth, 5));
    if (unused) spare = register_module("spare", torch::nn::Linear(kWidth, kWidth));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = in(x);
    for (auto& b : blocks) {
      h = checkpointed_ ? activation_checkpoint([&](const at::Tensor& t) { return b(t); }, h) : b(h);
    }
    return out(h);
  }
  torch::nn::Linear in{nullptr}, out{nullptr}, spare{nullptr};
  std::vector<ShardedUnit<BlockImpl>> blocks;
  bool checkpointed_;
};
TORCH_MODULE(Net);

inline std::shared_ptr<NetImpl> make_net(uint64_t seed, bool checkpointed = false, bool unused = false,
                                         int block_count = 3) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(seed);
  return std::make_shared<NetImpl>(checkpointed, unused, block_count);
}

struct Batch {
  at::Tensor x, y;
};

// This rank's batch of a step, independent of the global generator.
inline Batch batch_of(int rank, int step, int64_t rows = 6) {
  auto gen = at::detail::createCPUGenerator(1000 + 97 * static_cast<uint64_t>(rank) + step);
  return {at::randn({rows, 10}, gen), at::randn({rows, 5}, gen)};
}

inline DistributedDataParallelOptions small_buckets() {
  DistributedDataParallelOptions o;
  o.bucket_cap_mb = 0.004;
  o.first_bucket_cap_mb = 0.002;
  return o;
}

// Rows [rank * n / world, (rank + 1) * n / world) of step `step`'s global batch of n rows: the
// same samples whatever the world size, so runs at different world sizes follow one trajectory.
inline Batch global_batch_part(int rank, int world, int step, int64_t n = 12) {
  auto gen = at::detail::createCPUGenerator(5000 + static_cast<uint64_t>(step));
  Batch all{at::randn({n, 10}, gen), at::randn({n, 5}, gen)};
  const int64_t rows = n / world;
  return {all.x.narrow(0, rank * rows, rows), all.y.narrow(0, rank * rows, rows)};
}

}  // namespace tandem::sharded_test
