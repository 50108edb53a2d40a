// ShardedDataParallel with ranks as threads: every stage trains to DistributedDataParallel's
// parameters, and each bad input gets its error.
#include "tests/sharded/sharded_test_util.h"

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/checkpoint/safetensors.h>

#include <map>
#include <mutex>

#include <filesystem>
#include <fstream>

#include <sys/wait.h>
#include <unistd.h>

namespace tandem::sharded_test {
namespace {

using testing::run_ranks;

// Largest |a - b| over every parameter.
double max_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

bool bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equal(b[i])) return false;
  }
  return true;
}

struct Case {
  int world;
  int stage;
};

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, TwentyAdamWStepsEndWhereDistributedDataParallelEnds) {
  const auto [world, stage] = GetParam();
  const auto ddp = train(world, kDistributedDataParallel, 20);
  const auto sharded = train(world, stage, 20);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(bitwise_equal(sharded[r], sharded[0])) << "rank " << r << " differs from rank 0";
  }
  const double diff = max_difference(sharded[0], ddp[0]);
  std::printf("world %d stage %d: max |sharded - ddp| = %.3g\n", world, stage, diff);
  // On one host both reduce through shared memory, every element over ranks 0, 1, ..., N-1 in
  // that order (DDP's all-reduce and the sharded reduce-scatter alike; the shm tests check that
  // shared memory is in use here): nothing may differ, at any world size. Over TCP (Gloo's ring)
  // three or more ranks would sum in other orders, ~1 ulp per gradient.
  EXPECT_EQ(diff, 0.0);
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, Equivalence,
                         ::testing::Values(Case{1, 0}, Case{1, 1}, Case{1, 3}, Case{2, 0},
                                           Case{2, 1}, Case{2, 2}, Case{2, 3}, Case{3, 0},
                                           Case{3, 1}, Case{3, 2}, Case{3, 3}, Case{4, 3}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "_stage" +
                                  std::to_string(info.param.stage);
                         });

TEST(Sharded, ActivationCheckpointingInsideUnitsChangesNothing) {
  const auto plain = train(2, 3, 5);
  const auto checkpointed = train(2, 3, 5, {}, /*checkpointed=*/true);
  EXPECT_TRUE(bitwise_equal(plain[0], checkpointed[0]));
}

TEST(Sharded, ReshardAfterForwardOffAndNoPrefetchGiveTheSameBits) {
  const auto base = train(2, 3, 5);
  ShardingOptions o;
  o.reshard_after_forward = false;
  o.prefetch = false;
  EXPECT_TRUE(bitwise_equal(train(2, 3, 5, o)[0], base[0]));
}

TEST(Sharded, BackwardPrefetchBeforeOrAfterAUnitsBackwardGivesTheSameBits) {
  ShardingOptions pre;
  pre.backward_prefetch = "pre";
  EXPECT_TRUE(bitwise_equal(train(2, 3, 5, pre)[0], train(2, 3, 5)[0]));
}

TEST(Sharded, HybridShardingEqualsFullSharding) {
  ShardingOptions hybrid;
  hybrid.group_size = 2;
  const auto full = train(4, 3, 5);
  const auto hsdp = train(4, 3, 5, hybrid);
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(bitwise_equal(hsdp[r], hsdp[0])) << "rank " << r;
  // Two levels of averaging round differently from one.
  EXPECT_LE(max_difference(hsdp[0], full[0]), 2e-6);
}

TEST(Sharded, Bf16OnTheWireIsWithinBf16RoundingOfTheFp32Average) {
  // Each rank's gradient, in one process.
  std::vector<std::vector<at::Tensor>> local(2);
  for (int r = 0; r < 2; ++r) {
    auto m = make_net(4);
    Batch b = batch_of(r, 0);
    torch::mse_loss(m->forward(b.x), b.y).backward();
    for (auto& p : m->parameters()) local[r].push_back(p.grad().reshape({-1}));
  }
  double largest = 0;
  for (int r = 0; r < 2; ++r) {
    for (auto& g : local[r]) largest = std::max(largest, g.abs().max().item<double>());
  }
  std::map<std::string, std::vector<at::Tensor>> shard_grads;
  for (std::string wire : {"fp32", "bf16"}) {
    std::vector<std::shared_ptr<NetImpl>> models = {make_net(4), make_net(4)};
    std::vector<at::Tensor> grads(2);
    run_ranks(2, [&](Communicator& comm) {
      ShardingOptions o;
      o.stage = 2;
      o.reduce_dtype = wire;
      ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o, small_buckets());
      Batch b = batch_of(comm.rank(), 0);
      torch::mse_loss(sdp(b.x), b.y).backward();
      std::vector<at::Tensor> mine;
      for (auto& s : sdp.parameters()) mine.push_back(s.grad().clone());
      grads[comm.rank()] = at::cat(mine);
    });
    shard_grads[wire] = grads;
  }
  // (a/2 + b/2) with a/2, b/2 and the sum each rounded to bf16 (2^-8 relative): at most
  // 2^-8 (|a| + |b|) <= 2^-7 max|local gradient| from the fp32 average, element by element.
  for (int r = 0; r < 2; ++r) {
    const double diff = (shard_grads["bf16"][r] - shard_grads["fp32"][r]).abs().max().item<double>();
    EXPECT_GT(diff, 0.0) << "rank " << r << ": the wire was not bf16";
    EXPECT_LE(diff, std::ldexp(largest, -7)) << "rank " << r;
  }
}

TEST(Sharded, NoSyncAccumulationEqualsOneBigBatch) {
  for (int stage : {1, 2, 3}) {
    std::vector<std::shared_ptr<NetImpl>> models = {make_net(3), make_net(3)};
    std::vector<std::shared_ptr<NetImpl>> refs = {make_net(3), make_net(3)};
    std::vector<std::vector<at::Tensor>> accumulated(2), big(2);
    run_ranks(2, [&](Communicator& comm) {
      const int r = comm.rank();
      ShardingOptions o;
      o.stage = stage;
      {
        ShardedDataParallel sdp(models[r], borrow(comm), o, small_buckets());
        torch::optim::SGD opt(sdp.parameters(), 0.1);
        opt.zero_grad();
        Batch b = batch_of(r, 0, 8);
        {
          auto guard = sdp.no_sync();
          (torch::mse_loss(sdp(b.x.narrow(0, 0, 4)), b.y.narrow(0, 0, 4)) / 2).backward();
        }
        (torch::mse_loss(sdp(b.x.narrow(0, 4, 4)), b.y.narrow(0, 4, 4)) / 2).backward();
        opt.step();
        sdp.gather_parameters();
        for (auto& p : models[r]->parameters()) accumulated[r].push_back(p.detach().clone());
      }
      {
        ShardedDataParallel sdp(refs[r], borrow(comm), o, small_buckets());
        torch::optim::SGD opt(sdp.parameters(), 0.1);
        opt.zero_grad();
        Batch b = batch_of(r, 0, 8);
        torch::mse_loss(sdp(b.x), b.y).backward();
        opt.step();
        sdp.gather_parameters();
        for (auto& p : refs[r]->parameters()) big[r].push_back(p.detach().clone());
      }
    });
    EXPECT_LE(max_difference(accumulated[0], big[0]), 1e-6) << "stage " << stage;
  }
}

TEST(Sharded, ClipGradNormIsTheNormOverEveryShard) {
  for (int stage : {1, 2, 3}) {
    // The single-process norm of the averaged gradient.
    auto ref = make_net(5);
    std::vector<torch::Tensor> losses;
    torch::Tensor total;
    for (int r = 0; r < 3; ++r) {
      Batch b = batch_of(r, 0);
      auto l = torch::mse_loss(ref->forward(b.x), b.y) / 3.0;
      total = total.defined() ? total + l : l;
    }
    total.backward();
    double sq = 0;
    for (auto& p : ref->parameters()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    const double want = std::sqrt(sq);
    std::vector<std::shared_ptr<NetImpl>> models = {make_net(5), make_net(5), make_net(5)};
    std::vector<double> got(3);
    run_ranks(3, [&](Communicator& comm) {
      ShardingOptions o;
      o.stage = stage;
      ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o, small_buckets());
      Batch b = batch_of(comm.rank(), 0);
      torch::mse_loss(sdp(b.x), b.y).backward();
      got[comm.rank()] = sdp.clip_grad_norm(want / 2);
      EXPECT_NEAR(sdp.clip_grad_norm(1e9), want / 2, want * 1e-5);  // clipped to max_norm
    });
    for (int r = 0; r < 3; ++r) EXPECT_NEAR(got[r], want, want * 1e-6) << "stage " << stage;
  }
}

TEST(Sharded, TheConsolidatedExportIsDistributedDataParallelsModel) {
  char dir_template[] = "/tmp/tandem-export-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  for (int stage : {1, 2, 3}) {
    const auto ddp = train(2, kDistributedDataParallel, 5);
    std::vector<std::shared_ptr<NetImpl>> models = {make_net(7), make_net(7)};
    const std::string path = dir + "/stage" + std::to_string(stage) + ".safetensors";
    run_ranks(2, [&](Communicator& comm) {
      ShardingOptions o;
      o.stage = stage;
      auto model = models[comm.rank()];
      ShardedDataParallel sdp(model, borrow(comm), o, small_buckets());
      torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
      for (int step = 0; step < 5; ++step) {
        opt.zero_grad();
        Batch b = batch_of(comm.rank(), step);
        torch::mse_loss(sdp(b.x), b.y).backward();
        opt.step();
      }
      sdp.export_model(path);  // straight after the step: the export gathers what changed
    });
    const auto tensors = read_safetensors(path);
    const auto names = make_net(7)->named_parameters();
    ASSERT_EQ(tensors.size(), names.size()) << "stage " << stage;
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(tensors[i].first, names[i].key());
      EXPECT_TRUE(tensors[i].second.equal(ddp[0][i])) << "stage " << stage << " " << tensors[i].first;
    }
    auto fresh = make_net(99);
    load_safetensors(*fresh, path);
    for (size_t i = 0; i < ddp[0].size(); ++i) EXPECT_TRUE(fresh->parameters()[i].equal(ddp[0][i]));
  }
  std::filesystem::remove_all(dir);
}

// Steps [from, to) of a run at `world` ranks and `stage` that resumes from `dir` (if it holds a
// checkpoint) and saves every `save_every` steps; returns the global loss of each step it ran.
std::map<int, double> run_with_checkpoints(int world, int stage, const std::string& dir, int to,
                                           int save_every) {
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_net(11));
  std::map<int, double> losses;
  std::mutex mutex;
  run_ranks(world, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = stage;
    ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o, small_buckets());
    torch::optim::AdamW opt(sdp.parameters(), torch::optim::AdamWOptions(1e-2));
    CheckpointManagerOptions c;
    c.directory = dir;
    c.every_n_steps = save_every;
    c.keep_last = 0;
    c.async = false;
    c.communicator = borrow(comm);
    CheckpointManager ckpt(c);
    sdp.register_checkpoint(ckpt, "model");
    sdp.register_optimizer(ckpt, "optim", opt);
    for (int step = static_cast<int>(ckpt.resume()); step < to; ++step) {
      opt.zero_grad();
      Batch b = global_batch_part(comm.rank(), world, step);
      auto loss = torch::mse_loss(sdp(b.x), b.y);
      loss.backward();
      opt.step();
      at::Tensor total = loss.detach().reshape({1}) / world;
      comm.allreduce(total)->wait();
      if (comm.rank() == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        losses[step] = total.item<double>();
      }
      ckpt.maybe_save(step + 1);
    }
  });
  return losses;
}

struct Reshard {
  int from_world, from_stage, to_world, to_stage;
};

class Resharding : public ::testing::TestWithParam<Reshard> {};

TEST_P(Resharding, ACheckpointSavedAtOneWorldSizeContinuesAtAnother) {
  const Reshard c = GetParam();
  char dir_template[] = "/tmp/tandem-reshard-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  // Uninterrupted: 10 steps, a checkpoint at step 5 (and 10).
  const auto straight = run_with_checkpoints(c.from_world, c.from_stage, dir, 10, 5);
  std::filesystem::remove_all(dir + "/step_0000000010");
  const auto resumed = run_with_checkpoints(c.to_world, c.to_stage, dir, 10, 0);
  ASSERT_EQ(resumed.size(), 5u) << "the run did not resume at step 5";
  for (const auto& [step, loss] : resumed) {
    if (c.from_world == c.to_world && c.from_stage == c.to_stage) {
      EXPECT_EQ(loss, straight.at(step)) << "step " << step;  // nothing changed: bit for bit
    } else {
      // The same global batch every step; only the reduction order differs across world sizes.
      EXPECT_NEAR(loss, straight.at(step), 1e-5 * std::abs(straight.at(step))) << "step " << step;
    }
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Resharding,
                         ::testing::Values(Reshard{2, 3, 2, 3}, Reshard{2, 3, 1, 3}, Reshard{2, 3, 3, 3},
                                           Reshard{3, 3, 2, 3}, Reshard{2, 1, 3, 2},
                                           Reshard{2, 2, 2, 3}),
                         [](const auto& info) {
                           const Reshard& c = info.param;
                           return "w" + std::to_string(c.from_world) + "s" + std::to_string(c.from_stage) +
                                  "_to_w" + std::to_string(c.to_world) + "s" + std::to_string(c.to_stage);
                         });

TEST(ShardedErrors, ACheckpointWhoseShardingCannotBeMappedIsRefusedOnEveryRank) {
  char dir_template[] = "/tmp/tandem-reshard-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  run_with_checkpoints(2, 3, dir, 5, 5);
  // Another model: one more layer.
  std::vector<std::shared_ptr<NetImpl>> models = {make_net(1, false, true), make_net(1, false, true)};
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = 3;
    ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o, small_buckets());
    CheckpointManagerOptions c;
    c.directory = dir;
    c.async = false;
    c.communicator = borrow(comm);
    CheckpointManager ckpt(c);
    sdp.register_checkpoint(ckpt, "model");
    try {
      ckpt.resume();
    } catch (const CheckpointError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("does not fit: the checkpoint has no parameter 'spare."), std::string::npos) << e;
  }
  std::filesystem::remove_all(dir);
}

// An export SIGKILLed midway leaves its temporary file ("<path>.tmp.<pid>.<n>" of a process that
// is gone); the next export of that path removes it.
TEST(Sharded, AnExportRemovesTheTemporaryFileOfAKilledExport) {
  char dir_template[] = "/tmp/tandem-export-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  const std::string path = dir + "/model.safetensors";
  const pid_t killed = ::fork();
  if (killed == 0) ::_exit(0);
  ::waitpid(killed, nullptr, 0);
  std::ofstream(path + ".tmp." + std::to_string(killed) + ".0") << "half an export";
  std::vector<std::shared_ptr<NetImpl>> models = {make_net(7), make_net(7)};
  run_ranks(2, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = 3;
    ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o, small_buckets());
    sdp.export_model(path);
  });
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"model.safetensors"});
  std::filesystem::remove_all(dir);
}

// A checkpoint of three blocks into a model of two: the checkpoint's extra parameters are named
// (the slices this model asks for would all be there), the same on every rank of three, and a
// width that differs is named with both shapes.
TEST(ShardedErrors, ACheckpointOfAnotherModelIsRefusedWithTheSameMessageOnEveryRank) {
  char dir_template[] = "/tmp/tandem-reshard-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  run_with_checkpoints(3, 3, dir, 5, 5);
  const auto errors_loading = [&](const std::vector<std::shared_ptr<NetImpl>>& models) {
    std::vector<std::string> errors(3);
    run_ranks(3, [&](Communicator& comm) {
      ShardingOptions o;
      o.stage = 3;
      ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o, small_buckets());
      CheckpointManagerOptions c;
      c.directory = dir;
      c.async = false;
      c.communicator = borrow(comm);
      CheckpointManager ckpt(c);
      sdp.register_checkpoint(ckpt, "model");
      try {
        ckpt.resume();
      } catch (const CheckpointError& e) {
        errors[comm.rank()] = e.what();
      }
    });
    return errors;
  };
  std::vector<std::shared_ptr<NetImpl>> fewer;
  for (int r = 0; r < 3; ++r) fewer.push_back(make_net(1, false, false, /*block_count=*/2));
  const auto errors = errors_loading(fewer);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("the checkpoint has parameter 'block2."), std::string::npos) << e;
    EXPECT_NE(e.find("which this model lacks"), std::string::npos) << e;
    EXPECT_EQ(e, errors[0]);
  }
  std::filesystem::remove_all(dir);
}

// ---- bad input ------------------------------------------------------------------------------

struct NestedImpl : torch::nn::Module {
  NestedImpl() {
    inner = register_module("inner", ShardedUnit<BlockImpl>(Block()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return inner(x); }
  ShardedUnit<BlockImpl> inner{nullptr};
};
struct OuterImpl : torch::nn::Module {
  OuterImpl() { outer = register_module("outer", ShardedUnit<NestedImpl>(std::make_shared<NestedImpl>())); }
  torch::Tensor forward(const torch::Tensor& x) { return outer(x); }
  ShardedUnit<NestedImpl> outer{nullptr};
};

TEST(ShardedErrors, AParameterInTwoUnitsIsNamed) {
  auto model = std::make_shared<OuterImpl>();
  run_ranks(1, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = 3;
    try {
      ShardedDataParallel sdp(model, borrow(comm), o);
      FAIL() << "nested units were accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 'outer.inner.fc1.weight' is in two units"),
                std::string::npos) << e.what();
    }
  });
}

TEST(ShardedErrors, UnitsThatDifferAcrossRanksFailOnEveryRank) {
  std::vector<std::shared_ptr<NetImpl>> models = {make_net(1), make_net(1, false, /*unused=*/true)};
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = 3;
    try {
      ShardedDataParallel sdp(models[comm.rank()], borrow(comm), o);
    } catch (const ConfigError& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("the ranks built different models or units"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1"), std::string::npos) << e;
  }
}

TEST(ShardedErrors, AnOptimizerOverTheModelsParametersIsCaught) {
  for (int stage : {1, 2, 3}) {
    auto model = make_net(2);
    run_ranks(1, [&](Communicator& comm) {
      ShardingOptions o;
      o.stage = stage;
      ShardedDataParallel sdp(model, borrow(comm), o);
      torch::optim::SGD wrong(model->parameters(), 0.1);
      try {
        sdp.core().check_optimizer_parameters(wrong.param_groups()[0].params());
        FAIL() << "stage " << stage << ": the model's parameters were accepted";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("build it over ShardedDataParallel::parameters()"),
                  std::string::npos) << e.what();
      }
      torch::optim::SGD right(sdp.parameters(), 0.1);
      EXPECT_NO_THROW(sdp.core().check_optimizer_parameters(right.param_groups()[0].params()));
      if (stage < 3) {
        // Stepping the replicas themselves is caught at the next forward.
        Batch b = batch_of(0, 0);
        torch::mse_loss(sdp(b.x), b.y).backward();
        {
          torch::NoGradGuard no_grad;
          model->parameters()[0].add_(1.0);
        }
        try {
          sdp(b.x);
          FAIL() << "stage " << stage << ": an in-place change of the model went unnoticed";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("was modified in place since the last step"),
                    std::string::npos) << e.what();
        }
      }
    });
  }
}

TEST(ShardedErrors, AUnitRunTwiceInOneForwardIsNamed) {
  struct TwiceImpl : torch::nn::Module {
    TwiceImpl() { b = register_module("b", ShardedUnit<BlockImpl>(Block())); }
    torch::Tensor forward(const torch::Tensor& x) { return b(b(x)); }
    ShardedUnit<BlockImpl> b{nullptr};
  };
  auto model = std::make_shared<TwiceImpl>();
  run_ranks(1, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = 3;
    ShardedDataParallel sdp(model, borrow(comm), o);
    try {
      sdp(at::randn({2, kWidth}));
      FAIL() << "a unit ran twice";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unit 'b' ran its forward twice"), std::string::npos)
          << e.what();
    }
  });
}

TEST(ShardedErrors, BadOptionsNameTheKey) {
  auto model = make_net(1);
  run_ranks(2, [&](Communicator& comm) {
    ShardingOptions o;
    o.stage = 4;
    EXPECT_THROW(ShardedDataParallel(model, borrow(comm), o), ConfigError);
    o.stage = 3;
    o.group_size = 3;
    try {
      ShardedDataParallel sdp(model, borrow(comm), o);
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--set sharding.group_size="), std::string::npos) << e.what();
    }
    o.group_size = 0;
    o.backward_prefetch = "before";
    try {
      ShardedDataParallel sdp(model, borrow(comm), o);
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--set sharding.backward_prefetch=post"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace tandem::sharded_test
