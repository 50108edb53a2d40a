// Hybrid sharding under step-level fault tolerance, ranks as threads: a rank that lost its state
// (another initialisation, no optimizer state) builds its ShardedDataParallel without the
// broadcast and heals its shards of the parameters and of AdamW's state from the rank at the same
// position in the other replica group, while the others reconnect() keeping theirs; training on
// then gives the uninterrupted run's bits. Healing from a rank that holds other slices is refused.
#include "tests/sharded/sharded_test_util.h"

#include <tandem/checkpoint/checkpoint_manager.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

namespace tandem::sharded_test {
namespace {

using Sdp = ShardedDataParallel<NetImpl>;

void train_steps(Sdp& sdp, torch::optim::Optimizer& opt, int rank, int from, int to) {
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    Batch b = batch_of(rank, s);
    torch::mse_loss(sdp(b.x), b.y).backward();
    opt.step();
  }
}

// Healing reads and writes no file: the manager's directory is never created.
std::string unused_directory() {
  const char* base = std::getenv("TMPDIR");
  return std::string(base ? base : "/tmp") + "/tandem_sharded_heal_" + std::to_string(::getpid());
}

std::unique_ptr<CheckpointManager> manager(Communicator& comm) {
  CheckpointManagerOptions o;
  o.directory = unused_directory();
  o.async = false;
  o.communicator = borrow(comm);
  return std::make_unique<CheckpointManager>(o);
}

class ShardedHeal : public ::testing::TestWithParam<int> {};

TEST_P(ShardedHeal, AFreshRankHealsFromItsReplicaAndTrainsOnBitwise) {
  const int stage = GetParam();
  ShardingOptions sharding;
  sharding.stage = stage;
  sharding.group_size = 2;
  const auto uninterrupted = train(4, stage, 4, sharding);
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < 4; ++r) models.push_back(make_net(7));
  const auto fresh = make_net(99);  // rank 3's replacement: other values
  std::vector<std::vector<at::Tensor>> result(4);
  testing::run_ranks(4, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    auto sdp = std::make_unique<Sdp>(model, borrow(comm), sharding, small_buckets());
    auto opt = std::make_unique<torch::optim::AdamW>(sdp->parameters(), torch::optim::AdamWOptions(1e-2));
    train_steps(*sdp, *opt, rank, 0, 2);
    if (rank == 3) {  // lost: a new process would start from scratch
      opt.reset();
      sdp.reset();
      model = fresh;
      sdp = std::make_unique<Sdp>(model, borrow(comm), sharding, small_buckets(),
                                  ShardedStart::kLoadedAfter);
      opt = std::make_unique<torch::optim::AdamW>(sdp->parameters(), torch::optim::AdamWOptions(1e-2));
    } else {
      sdp->reconnect(borrow(comm));
    }
    auto ckpt = manager(comm);
    sdp->register_checkpoint(*ckpt, "model");
    sdp->register_optimizer(*ckpt, "optim", *opt);
    ckpt->heal({1}, {3});  // rank 1 holds shard 1 of the other group
    train_steps(*sdp, *opt, rank, 2, 4);
    sdp->gather_parameters();
    for (const auto& p : model->parameters()) result[rank].push_back(p.detach().clone());
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(result[r].size(), uninterrupted[r].size());
    for (size_t i = 0; i < result[r].size(); ++i)
      EXPECT_TRUE(result[r][i].equal(uninterrupted[r][i])) << "rank " << r << " parameter " << i;
  }
  EXPECT_FALSE(std::filesystem::exists(unused_directory()));
}

INSTANTIATE_TEST_SUITE_P(Stages, ShardedHeal, ::testing::Values(1, 2, 3));

TEST(ShardedHealErrors, ARankHoldingOtherSlicesCannotHeal) {
  ShardingOptions sharding;
  sharding.stage = 2;
  sharding.group_size = 2;
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < 4; ++r) models.push_back(make_net(7));
  testing::run_ranks(4, [&](Communicator& comm) {
    Sdp sdp(models[comm.rank()], borrow(comm), sharding, small_buckets());
    torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
    train_steps(sdp, opt, comm.rank(), 0, 1);  // AdamW's state exists
    auto ckpt = manager(comm);
    sdp.register_optimizer(*ckpt, "optim", opt);  // one state: the refusal ends the stream
    EXPECT_THROW(ckpt->heal({3}, {3}), CheckpointError);
    EXPECT_THROW(ckpt->heal({0, 0}, {3}), CheckpointError);
    EXPECT_THROW(ckpt->heal({0, 0}, {3, 3}), CheckpointError);
    if (comm.rank() == 1 || comm.rank() == 2) return;
    if (comm.rank() == 0) {  // it holds shard 0; rank 3 needs shard 1
      // The refusal reaches the source only as a broken wire (the receiver leaves mid-stream), or
      // not at all when the rest of the stream fit in the socket's buffers.
      try {
        ckpt->heal({0}, {3});
      } catch (const CommError&) {
      }
      return;
    }
    try {
      ckpt->heal({0}, {3});
      FAIL() << "no error";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("state 'optim' from rank 0 does not fit here"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("the same position in another replica group"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace tandem::sharded_test
