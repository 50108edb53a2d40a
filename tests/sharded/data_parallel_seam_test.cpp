// The data-parallel seam (tandem/runtime/data_parallel.h): what both wrappers share behaves the
// same under both. Ranks as threads.
#include "tests/sharded/sharded_test_util.h"

namespace tandem::sharded_test {
namespace {

using testing::run_ranks;

// A module whose forward returns one of its parameters as an output: backward reaches that
// parameter straight from the output (a leaf), not through a grad_fn.
struct LeafOutputImpl : torch::nn::Module {
  LeafOutputImpl() {
    torch::manual_seed(11);
    fc = register_module("fc", torch::nn::Linear(5, 3));
    scale = register_parameter("scale", torch::randn({3}));
  }
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) { return {fc(x), scale}; }
  torch::nn::Linear fc{nullptr};
  at::Tensor scale;
};

at::Tensor loss_of(const std::tuple<at::Tensor, at::Tensor>& out, int rank, int step) {
  const auto& [y, scale] = out;
  auto target = at::full({4, 3}, 0.1 * (rank + 1) + 0.01 * step);
  return (y * scale).sub(target).pow(2).mean() + scale.pow(2).sum();
}

// Every wrapper's parameters after 3 SGD steps at world 2 with find_unused_parameters, as one
// flat tensor per rank (stage -1: DistributedDataParallel).
std::vector<at::Tensor> train_leaf_output(int stage) {
  std::vector<std::shared_ptr<LeafOutputImpl>> models;
  for (int r = 0; r < 2; ++r) models.push_back(std::make_shared<LeafOutputImpl>());
  std::vector<at::Tensor> result(2);
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    DistributedDataParallelOptions ddp;
    ddp.find_unused_parameters = true;
    auto x = at::ones({4, 5}) * (rank + 1);
    auto run = [&](auto& wrapper, std::vector<at::Tensor> params) {
      torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        loss_of(wrapper(x), rank, step).backward();
        opt.step();
      }
    };
    if (stage == kDistributedDataParallel) {
      DistributedDataParallel wrapper(model, borrow(comm), ddp);
      run(wrapper, wrapper.parameters());
    } else {
      ShardingOptions sharding;
      sharding.stage = stage;
      ShardedDataParallel wrapper(model, borrow(comm), sharding, ddp);
      run(wrapper, wrapper.parameters());
      wrapper.gather_parameters();
    }
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
    result[rank] = at::cat(flat);
  });
  return result;
}

TEST(DataParallelSeam, AnOutputThatIsAParameterIsUsedUnderBothWrappers) {
  const auto ddp = train_leaf_output(kDistributedDataParallel);
  ASSERT_TRUE(ddp[0].equal(ddp[1]));
  const auto initial = [] {
    std::vector<at::Tensor> flat;
    for (const auto& p : LeafOutputImpl().parameters()) flat.push_back(p.detach().reshape({-1}));
    return at::cat(flat);
  }();
  EXPECT_FALSE(ddp[0].equal(initial)) << "DDP did not train";
  for (int stage : {0, 1, 2, 3}) {
    const auto sharded = train_leaf_output(stage);
    EXPECT_TRUE(sharded[0].equal(ddp[0])) << "stage " << stage << " differs from DDP by "
                                          << (sharded[0] - ddp[0]).abs().max().item<double>();
    EXPECT_TRUE(sharded[1].equal(sharded[0])) << "stage " << stage;
  }
}

TEST(DataParallelSeam, NoSyncIsOneGuardForBothWrappers) {
  auto model = make_net(2);
  auto sharded_model = make_net(2);
  run_ranks(1, [&](Communicator& comm) {
    DistributedDataParallel ddp(model, borrow(comm), small_buckets());
    NoSyncGuard guard = ddp.no_sync();
    ShardingOptions sharding;
    sharding.stage = 2;
    ShardedDataParallel sdp(sharded_model, borrow(comm), sharding, small_buckets());
    NoSyncGuard sharded_guard = sdp.no_sync();
    SUCCEED();  // one type: the line above compiles
  });
}

TEST(DataParallelSeam, BucketCapsAreCheckedOnceForBothWrappers) {
  auto model = make_net(3);
  DistributedDataParallelOptions bad = small_buckets();
  bad.bucket_cap_mb = 0;
  run_ranks(1, [&](Communicator& comm) {
    for (int wrapper = 0; wrapper < 2; ++wrapper) {
      try {
        if (wrapper == 0) {
          DistributedDataParallel ddp(model, borrow(comm), bad);
        } else {
          ShardingOptions sharding;
          sharding.stage = 1;
          ShardedDataParallel sdp(model, borrow(comm), sharding, bad);
        }
        ADD_FAILURE() << "a zero bucket cap was accepted by wrapper " << wrapper;
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("--set ddp.bucket_cap_mb="), std::string::npos)
            << e.what();
      }
    }
  });
}

TEST(DataParallelSeam, StageZeroShardsNothingAndRefusesAGroupSize) {
  EXPECT_EQ(ShardingPolicy::of_stage(0).optimizer_state, false);
  EXPECT_EQ(ShardingPolicy::of_stage(2).gradients, true);
  EXPECT_EQ(ShardingPolicy::of_stage(2).parameters, false);
  EXPECT_THROW(ShardingPolicy::of_stage(-1), ConfigError);
  std::vector<std::shared_ptr<NetImpl>> models = {make_net(4), make_net(4)};
  auto spare = make_net(4);
  run_ranks(2, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    ShardingOptions sharding;
    sharding.stage = 0;
    ShardedDataParallel sdp(model, borrow(comm), sharding, small_buckets());
    // The optimizer gets every element of every parameter (and the alignment gaps between them).
    for (const auto& slice : sdp.core().parameter_slices()) {
      int64_t numel = 1;
      for (int64_t d : slice.shape) numel *= d;
      EXPECT_EQ(slice.begin, 0) << slice.name;
      EXPECT_EQ(slice.end, numel) << slice.name << ": stage 0 must give the optimizer everything";
    }
    sharding.group_size = 2;
    EXPECT_THROW(ShardedDataParallel(spare, borrow(comm), sharding), ConfigError);
  });
}

// Odd-sized parameters in one flat buffer: each view starts where a tensor of its own would
// (64 bytes on the CPU, 256 on CUDA), under DistributedDataParallel (gradients in its buckets)
// and every sharding stage (parameters in units, each shard too). Kernels choose code paths by
// pointer alignment, so a misaligned view can give other bits than the plain model (issue 37).
struct OddImpl : torch::nn::Module {
  OddImpl() {
    torch::manual_seed(5);
    a = register_module("a", torch::nn::Linear(7, 5));   // 35 + 5 floats: no multiple of 16
    b = register_module("b", torch::nn::Linear(5, 3));
    c = register_parameter("c", torch::randn({3}));
  }
  at::Tensor forward(const at::Tensor& x) { return b(torch::relu(a(x))) * c; }
  torch::nn::Linear a{nullptr}, b{nullptr};
  at::Tensor c;
};

std::string misaligned(const std::string& what, const at::Tensor& t) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  return address % 64 == 0 ? "" : what + " starts at " + std::to_string(address % 64) +
                                      " bytes past a 64-byte boundary\n";
}

TEST(DataParallelSeam, EveryParameterViewInAFlatBufferIsAlignedAsATensorOfItsOwn) {
  for (int stage : {kDistributedDataParallel, 0, 1, 2, 3}) {
    std::vector<std::shared_ptr<OddImpl>> models = {std::make_shared<OddImpl>(),
                                                    std::make_shared<OddImpl>()};
    std::vector<std::string> problems(2);
    run_ranks(2, [&](Communicator& comm) {
      auto model = models[comm.rank()];
      std::string& found = problems[comm.rank()];
      const at::Tensor x = at::ones({4, 7});
      auto check = [&](auto& wrapper) {
        wrapper(x).sum().backward();
        for (const auto& p : model->named_parameters()) {
          if (stage != 3) found += misaligned(p.key(), p.value());
          if (p.value().grad().defined()) found += misaligned(p.key() + ".grad", p.value().grad());
        }
        for (size_t i = 0; i < wrapper.parameters().size(); ++i) {
          found += misaligned("optimizer tensor " + std::to_string(i), wrapper.parameters()[i]);
        }
      };
      if (stage == kDistributedDataParallel) {
        DistributedDataParallel wrapper(model, borrow(comm), small_buckets());
        check(wrapper);
      } else {
        ShardingOptions sharding;
        sharding.stage = stage;
        ShardedDataParallel wrapper(model, borrow(comm), sharding, small_buckets());
        check(wrapper);
      }
    });
    EXPECT_EQ(problems[0] + problems[1], "") << "stage " << stage;
  }
}

}  // namespace
}  // namespace tandem::sharded_test
