// Shared by the ShardedDataParallel threads tests: runs of N training steps under
// DistributedDataParallel or ShardedDataParallel with ranks as threads. Models are built on the
// test's main thread (the global generator is process-wide); rank threads only train.
#pragma once

#include "tests/sharded/test_model.h"
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/activation_checkpoint.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <mutex>
#include <vector>

namespace tandem::sharded_test {

inline std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

// train()'s stage for DistributedDataParallel (0-3: ShardedDataParallel at that stage).
constexpr int kDistributedDataParallel = -1;

// Parameters of every rank after `steps` AdamW steps.
inline std::vector<std::vector<at::Tensor>> train(int world, int stage, int steps,
                                                  ShardingOptions sharding = {},
                                                  bool checkpointed = false) {
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_net(7, checkpointed));
  std::vector<std::vector<at::Tensor>> result(world);
  testing::run_ranks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    if (stage == kDistributedDataParallel) {
      DistributedDataParallel ddp(model, borrow(comm), small_buckets());
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        Batch b = batch_of(rank, s);
        torch::mse_loss(ddp(b.x), b.y).backward();
        opt.step();
      }
    } else {
      sharding.stage = stage;
      ShardedDataParallel sdp(model, borrow(comm), sharding, small_buckets());
      torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        Batch b = batch_of(rank, s);
        torch::mse_loss(sdp(b.x), b.y).backward();
        opt.step();
      }
      sdp.gather_parameters();
    }
    for (const auto& p : model->parameters()) result[rank].push_back(p.detach().clone());
  });
  return result;
}

}  // namespace tandem::sharded_test
