// Low-precision parameters with fp32 masters (ranks as threads): the model runs in bf16 while the
// optimizer steps fp32 masters; every sharding stage ends bitwise where DistributedDataParallel
// does; reducing in bf16 stays within bf16 rounding of reducing in fp32; the global gradient norm
// under stages 1-3 is the single-process norm; a non-finite norm leaves the gradients alone; a
// checkpoint of masters loads into an fp32 model; Join with uneven batches.
#include "tests/sharded/sharded_test_util.h"

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/grad_norm.h>
#include <tandem/runtime/join.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace tandem {
namespace {

using namespace sharded_test;

DistributedDataParallelOptions bf16(bool reduce_in_fp32 = true) {
  DistributedDataParallelOptions o = small_buckets();
  o.mixed_precision.param_dtype = at::kBFloat16;
  o.mixed_precision.reduce_in_fp32 = reduce_in_fp32;
  return o;
}

// The fp32 masters of a sharded model (or tensors shaped like them: sdp.parameters()), whole on
// every rank, one tensor per parameter in model order: each rank's slices of each parameter
// (slices_of: a unit's parameters sit at aligned offsets in its flat buffer), summed over the
// ranks into zeros (each element is in one rank's slice only, so the sum is its value).
template <class Sharded>
std::vector<at::Tensor> gathered_masters(Sharded& sdp, torch::nn::Module& model, Communicator& comm) {
  std::map<std::string, at::Tensor> full;
  const auto named = model.named_parameters();
  for (const auto& p : named) full[p.key()] = at::zeros({p.value().numel()}, at::kFloat);
  for (const auto& s : sdp.core().slices_of(sdp.parameters())) {
    if (s.end > s.begin) full.at(s.name).narrow(0, s.begin, s.end - s.begin).copy_(s.data.reshape({-1}));
  }
  std::vector<at::Tensor> out;
  for (const auto& p : named) {
    at::Tensor t = full.at(p.key());
    comm.allreduce(t)->wait();
    out.push_back(t.view(p.value().sizes()));
  }
  return out;
}

// Every rank's fp32 masters (gathered from the shards) after `steps` AdamW steps; stage 0 is
// DistributedDataParallel.
std::vector<std::vector<at::Tensor>> train_masters(int world, int stage, int steps,
                                                   DistributedDataParallelOptions options) {
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_net(7));
  std::vector<std::vector<at::Tensor>> result(world);
  testing::run_ranks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    std::vector<at::Tensor> masters;
    auto loop = [&](auto& wrapper) {
      torch::optim::AdamW opt(wrapper.parameters(), torch::optim::AdamWOptions(1e-2));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        Batch b = batch_of(rank, s);
        torch::mse_loss(wrapper(b.x).to(at::kFloat), b.y).backward();
        opt.step();
      }
    };
    if (stage == 0) {
      DistributedDataParallel ddp(model, borrow(comm), options);
      loop(ddp);
      for (const auto& m : ddp.parameters()) masters.push_back(m.detach().clone());
    } else {
      ShardingOptions sharding;
      sharding.stage = stage;
      ShardedDataParallel sdp(model, borrow(comm), sharding, options);
      loop(sdp);
      masters = gathered_masters(sdp, *model, comm);
    }
    result[rank] = masters;
  });
  return result;
}

// The masters as one flat fp32 vector in the model's parameter order.
at::Tensor flat(const std::vector<at::Tensor>& masters) {
  std::vector<at::Tensor> parts;
  for (const auto& m : masters) parts.push_back(m.reshape({-1}));
  return at::cat(parts);
}

TEST(MixedPrecision, TheModelRunsInBf16WhileTheOptimizerStepsFp32Masters) {
  auto model = make_net(7);
  const auto before = model->parameters()[0].detach().clone();
  testing::run_ranks(1, [&](Communicator& comm) {
    DistributedDataParallel ddp(model, borrow(comm), bf16());
    for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
    const auto masters = ddp.parameters();
    ASSERT_EQ(masters.size(), model->parameters().size());
    for (const auto& m : masters) EXPECT_EQ(m.scalar_type(), at::kFloat);
    EXPECT_TRUE(masters[0].equal(before)) << "the masters start from the fp32 values";
    torch::optim::SGD opt(masters, 0.1);
    Batch b = batch_of(0, 0);
    auto out = ddp(b.x);  // fp32 input, cast to bf16 by the wrapper
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    torch::mse_loss(out.to(at::kFloat), b.y).backward();
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "low-precision grads are released";
    for (const auto& m : masters) ASSERT_EQ(m.grad().scalar_type(), at::kFloat);
    opt.step();
    EXPECT_FALSE(masters[0].equal(before));
    ddp(b.x);  // the next forward casts the stepped masters into the model
    EXPECT_TRUE(model->parameters()[0].equal(masters[0].to(at::kBFloat16)));
  });
}

TEST(MixedPrecision, EveryShardingStageEndsBitwiseWhereDistributedDataParallelDoes) {
  for (int world : {1, 2}) {
    const at::Tensor ddp = flat(train_masters(world, 0, 12, bf16())[0]);
    for (int stage : {1, 2, 3}) {
      const auto sharded = train_masters(world, stage, 12, bf16());
      // Both average two fp32 gradients (a + b == b + a) and step the same fp32 masters.
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(flat(sharded[r]).equal(ddp)) << "world " << world << " stage " << stage << " rank " << r;
      }
    }
  }
}

// The averaged fp32 gradients of the masters after one backward at world 2 (stage 0:
// DistributedDataParallel), gathered into one vector in model order.
at::Tensor first_gradients(int stage, bool reduce_in_fp32) {
  std::vector<std::shared_ptr<NetImpl>> models = {make_net(7), make_net(7)};
  at::Tensor result;
  testing::run_ranks(2, [&](Communicator& comm) {
    auto backward = [&](auto& wrapper) {
      Batch b = batch_of(comm.rank(), 0);
      torch::mse_loss(wrapper(b.x).to(at::kFloat), b.y).backward();
    };
    std::vector<at::Tensor> grads;
    if (stage == 0) {
      DistributedDataParallel ddp(models[comm.rank()], borrow(comm), bf16(reduce_in_fp32));
      backward(ddp);
      for (const auto& m : ddp.parameters()) grads.push_back(m.grad().reshape({-1}));
    } else {
      ShardingOptions sharding;
      sharding.stage = stage;
      ShardedDataParallel sdp(models[comm.rank()], borrow(comm), sharding, bf16(reduce_in_fp32));
      backward(sdp);
      std::vector<at::Tensor> shard_grads;
      for (const auto& shard : sdp.parameters()) shard_grads.push_back(shard.grad());
      // Reuse the masters' gatherer on the gradients: same layout.
      struct View {
        ShardedDataParallel<NetImpl>& sdp;
        std::vector<at::Tensor> shards;
        std::vector<at::Tensor> parameters() const { return shards; }
        ShardedDataParallelCore& core() { return sdp.core(); }
      } view{sdp, shard_grads};
      for (const auto& g : gathered_masters(view, *models[comm.rank()], comm)) grads.push_back(g.reshape({-1}));
    }
    if (comm.rank() == 0) result = at::cat(grads);
  });
  return result;
}

TEST(MixedPrecision, ReducingInBf16StaysWithinBf16RoundingOfReducingInFp32) {
  for (int stage : {0, 2}) {
    const at::Tensor fp32 = first_gradients(stage, true);
    const at::Tensor low = first_gradients(stage, false);
    // Each rank's gradient is a bf16 number; their average in fp32 is exact but for the last
    // bits, while summing in bf16 rounds it to 8 significant bits (once, or once per term: at
    // most 2^-8 relative). Not bitwise: the rounding is real.
    EXPECT_FALSE(low.equal(fp32)) << "stage " << stage;
    const at::Tensor bound = fp32.abs() * std::ldexp(1.0, -8) + 1e-30;
    EXPECT_TRUE(((low - fp32).abs() <= bound).all().item<bool>())
        << "stage " << stage << ": worst relative error "
        << ((low - fp32).abs() / (fp32.abs() + 1e-30)).max().item<double>();
  }
}

// Parameters in model order, and their gradients' single-process norm over one big batch.
double single_process_norm(int world, int steps_before) {
  auto model = make_net(7);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s <= steps_before; ++s) {
    opt.zero_grad();
    at::Tensor loss = at::zeros({});
    for (int r = 0; r < world; ++r) {
      Batch b = batch_of(r, s);
      loss = loss + torch::mse_loss(model->forward(b.x), b.y) / world;
    }
    loss.backward();
    if (s < steps_before) opt.step();
  }
  double sum = 0;
  for (const auto& p : model->parameters()) sum += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

TEST(MixedPrecision, ClipGradNormUnderEveryStageIsTheSingleProcessNorm) {
  for (int world : {2, 3}) {
    const double want = single_process_norm(world, 0);
    for (int stage : {1, 2, 3}) {
      std::vector<std::shared_ptr<NetImpl>> models;
      for (int r = 0; r < world; ++r) models.push_back(make_net(7));
      std::vector<double> got(world);
      testing::run_ranks(world, [&](Communicator& comm) {
        ShardingOptions sharding;
        sharding.stage = stage;
        ShardedDataParallel sdp(models[comm.rank()], borrow(comm), sharding, small_buckets());
        torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
        opt.zero_grad();
        Batch b = batch_of(comm.rank(), 0);
        torch::mse_loss(sdp(b.x), b.y).backward();
        got[comm.rank()] = clip_grad_norm(sdp.parameters(), 1e9, 2.0, &comm);
      });
      for (double g : got) {
        EXPECT_NEAR(g, want, want * 1e-6) << "world " << world << " stage " << stage;
      }
    }
  }
}

TEST(MixedPrecision, ANonFiniteNormLeavesTheGradientsAlone) {
  auto a = torch::ones({3}, torch::requires_grad());
  auto b = torch::ones({2}, torch::requires_grad());
  (a * std::numeric_limits<float>::infinity()).sum().backward();
  (b * 2).sum().backward();
  const auto grad_b = b.grad().clone();
  EXPECT_TRUE(std::isinf(clip_grad_norm({a, b}, 1.0)));
  EXPECT_TRUE(b.grad().equal(grad_b)) << "a finite gradient was scaled by a non-finite norm";
  a.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(std::isfinite(clip_grad_norm({a, b}, 1.0, std::numeric_limits<double>::infinity())));
  EXPECT_TRUE(b.grad().equal(grad_b));
  EXPECT_THROW(clip_grad_norm({a, b}, 0.0), ConfigError);
  EXPECT_THROW(clip_grad_norm({a, b}, 1.0, -1.0), ConfigError);
}

TEST(MixedPrecision, ACheckpointOfMastersLoadsIntoAnFp32Model) {
  const std::string dir = std::filesystem::temp_directory_path() / "tandem-mp-ckpt-XXXXXX";
  std::vector<char> tmpl(dir.begin(), dir.end());
  tmpl.push_back('\0');
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string path = tmpl.data();
  auto model = make_net(7);
  std::vector<at::Tensor> masters;
  testing::run_ranks(1, [&](Communicator& comm) {
    DistributedDataParallel ddp(model, borrow(comm), bf16());
    torch::optim::SGD opt(ddp.parameters(), 0.1);
    Batch b = batch_of(0, 0);
    torch::mse_loss(ddp(b.x).to(at::kFloat), b.y).backward();
    opt.step();
    CheckpointManagerOptions o;
    o.directory = path;
    o.async = false;
    CheckpointManager ckpt(o);
    ddp.register_checkpoint(ckpt, "model");
    ckpt.save(1);
    for (const auto& m : ddp.parameters()) masters.push_back(m.detach().clone());
  });
  auto plain = make_net(99);
  CheckpointManagerOptions o;
  o.directory = path;
  CheckpointManager ckpt(o);
  ckpt.add_module("model", *plain);
  ASSERT_EQ(ckpt.resume(), 1);
  const auto params = plain->parameters();
  ASSERT_EQ(params.size(), masters.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(masters[i])) << i;
  std::filesystem::remove_all(path);
}

TEST(MixedPrecision, AnUnsupportedParamDtypeIsRefused) {
  auto model = make_net(7);
  DistributedDataParallelOptions o;
  o.mixed_precision.param_dtype = at::kDouble;
  testing::run_ranks(1, [&](Communicator& comm) {
    try {
      DistributedDataParallel ddp(model, borrow(comm), o);
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--set precision.param_dtype="), std::string::npos) << e.what();
    }
  });
}

// Join (ranks as threads; the process tests run it under tandemrun): world 2 and 3, ranks with 10
// and 13 batches, DistributedDataParallel and stages 1-3 with bf16 parameters.
TEST(Join, RanksWithUnevenBatchesFinishAndTheirMastersAgree) {
  for (int world : {2, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      std::vector<std::shared_ptr<NetImpl>> models;
      for (int r = 0; r < world; ++r) models.push_back(make_net(7));
      std::vector<at::Tensor> result(world);
      std::vector<int64_t> shadowed(world);
      testing::run_ranks(world, [&](Communicator& comm) {
        const int rank = comm.rank();
        const int batches = rank % 2 == 1 ? 13 : 10;
        auto loop = [&](auto& wrapper) {
          torch::optim::AdamW opt(wrapper.parameters(), torch::optim::AdamWOptions(1e-2));
          Join join(wrapper, [&] { opt.step(); });
          for (int s = 0; s < batches; ++s) {
            opt.zero_grad();
            Batch b = batch_of(rank, s);
            torch::mse_loss(wrapper(b.x).to(at::kFloat), b.y).backward();
            opt.step();
          }
          join.finish();
          shadowed[rank] = join.shadowed_steps();
        };
        if (stage == 0) {
          DistributedDataParallel ddp(models[rank], borrow(comm), bf16());
          loop(ddp);
          result[rank] = flat(ddp.parameters());
        } else {
          ShardingOptions sharding;
          sharding.stage = stage;
          ShardedDataParallel sdp(models[rank], borrow(comm), sharding, bf16());
          loop(sdp);
          result[rank] = flat(gathered_masters(sdp, *models[rank], comm));
        }
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(result[r].equal(result[0])) << "world " << world << " stage " << stage << " rank " << r;
        EXPECT_EQ(shadowed[r], r % 2 == 1 ? 0 : 3) << "world " << world << " stage " << stage << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
