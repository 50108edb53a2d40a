// DistributedDataParallel edge cases, ranks as threads: unused parameters, buffers, mismatched
// models, skipped backwards, construction errors and module holders.
#include "tests/unit/data_parallel_test_util.h"

namespace tandem {
namespace {

// ---------------------------------------------------------------------------------------------
// 5. Unused parameters. Parametrised by world size and gradient_as_bucket_view.

class DistributedDataParallelUnused : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

std::string unused_name(const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
  return "world" + std::to_string(std::get<0>(info.param)) +
         (std::get<1>(info.param) ? "_view" : "_copy");
}

TEST_P(DistributedDataParallelUnused,
       BranchUsedOnSomeRanksIsAveragedAndGloballyUnusedStaysUndefined) {
  const int world = std::get<0>(GetParam());
  const bool as_view = std::get<1>(GetParam());
  const int64_t n = 4;
  auto uses_branch = [](int rank) { return rank % 2 == 0; };
  auto reference = make_model<BranchyImpl>(0);
  const auto want = averaged_reference(*reference, world, [&](BranchyImpl& m, int r) {
    const Batch b = make_batch(n, seed_of(r, 0), 6, 3);
    return torch::mse_loss(m.forward(b.x, uses_branch(r)), b.y);
  });
  ASSERT_FALSE(want[6].defined());  // unused.weight
  const auto models = make_replicas<BranchyImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallelOptions options = small_buckets();
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = as_view;
    DistributedDataParallel ddp(model, borrow(comm), options);
    const Batch b = make_batch(n, seed_of(comm.rank(), 0), 6, 3);
    for (int iter = 0; iter < 3; ++iter) {  // before and after the rebuild
      torch::mse_loss(ddp(b.x, uses_branch(comm.rank())), b.y).backward();
      expect_grads(*model, want, world == 1,
                   "rank " + std::to_string(comm.rank()) + " iteration " + std::to_string(iter));
      model->zero_grad();
    }
  }, timeout_of(20s));
}

TEST_P(DistributedDataParallelUnused,
       NoSyncAccumulationReducesParametersUsedOnlyInEarlierMicroSteps) {
  // Micro-step 0 uses the branch on every rank, micro-step 1 on odd ranks, the synchronised
  // micro-step 2 on none: the branch's accumulated gradient must still be averaged.
  const int world = std::get<0>(GetParam());
  const bool as_view = std::get<1>(GetParam());
  const int micro = 3;
  auto flag = [](int rank, int m) { return m == 0 || (m == 1 && rank % 2 == 1); };
  auto batch = [](int rank, int m) { return make_batch(3, seed_of(rank, 10 + m), 6, 3); };
  auto reference = make_model<BranchyImpl>(0);
  const auto want = averaged_reference(*reference, world, [&](BranchyImpl& model, int r) {
    torch::Tensor total;
    for (int m = 0; m < micro; ++m) {
      const Batch b = batch(r, m);
      auto l = torch::mse_loss(model.forward(b.x, flag(r, m)), b.y) / double(micro);
      total = total.defined() ? total + l : l;
    }
    return total;
  });
  const auto models = make_replicas<BranchyImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    auto codec = std::make_shared<RecordingCodec>();
    DistributedDataParallelOptions options = small_buckets();
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = as_view;
    options.codec = codec;
    DistributedDataParallel ddp(model, borrow(comm), options);
    for (int round = 0; round < 2; ++round) {
      {
        auto guard = ddp.no_sync();
        for (int m = 0; m + 1 < micro; ++m) {
          const Batch b = batch(rank, m);
          (torch::mse_loss(ddp(b.x, flag(rank, m)), b.y) / double(micro)).backward();
        }
      }
      EXPECT_TRUE(codec->take().empty()) << "no_sync must not communicate gradients";
      const Batch b = batch(rank, micro - 1);
      (torch::mse_loss(ddp(b.x, flag(rank, micro - 1)), b.y) / double(micro)).backward();
      EXPECT_EQ(codec->take().size(), ddp.reducer().bucket_plan().size());
      expect_grads(*model, want, false,
                   "rank " + std::to_string(rank) + " round " + std::to_string(round));
      model->zero_grad();
    }
  }, timeout_of(20s));
}

TEST_P(DistributedDataParallelUnused, ForwardWithoutBackwardLeavesExistingGradsAlone) {
  // backward, then an evaluation forward in grad mode that skips the branch (no backward), then
  // the optimizer step: .grad must still hold the averaged gradients of the backward, in both
  // gradient modes.
  const int world = std::get<0>(GetParam());
  const bool as_view = std::get<1>(GetParam());
  const Batch data = make_batch(4, 21, 6, 3);
  auto reference = make_model<BranchyImpl>(0, false);
  const auto want = averaged_reference(*reference, world, [&](BranchyImpl& m, int) {
    return torch::mse_loss(m.forward(data.x, true), data.y);
  });
  const auto models = make_replicas<BranchyImpl>(world, 0, false);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallelOptions options = small_buckets();
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = as_view;
    DistributedDataParallel ddp(model, borrow(comm), options);
    for (int iter = 0; iter < 3; ++iter) {
      const std::string where =
          "rank " + std::to_string(comm.rank()) + " iteration " + std::to_string(iter);
      torch::mse_loss(ddp(data.x, true), data.y).backward();
      expect_grads(*model, want, world == 1, where + " after backward");
      ddp(data.x, false);  // evaluation without the branch, no backward
      expect_grads(*model, want, world == 1, where + " after a forward without backward");
      model->zero_grad();
    }
  }, timeout_of(20s));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelUnused,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         unused_name);

// ---------------------------------------------------------------------------------------------
// 7. Buffers.

class DistributedDataParallelBuffers : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_P(DistributedDataParallelBuffers, ForwardBroadcastsRankZerosBuffersOnlyWhenAsked) {
  const int world = std::get<0>(GetParam());
  const bool broadcast = std::get<1>(GetParam());
  std::vector<std::shared_ptr<WithBuffersImpl>> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(make_model<WithBuffersImpl>(50 + r));
    models.back()->shift.fill_(r + 1);
    models.back()->count.fill_(7 * r);
    models.back()->bn->running_mean.fill_(r);
  }
  run_ranks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    DistributedDataParallelOptions options;
    options.broadcast_buffers = broadcast;
    DistributedDataParallel ddp(model, borrow(comm), options);
    // Construction always starts every replica from rank 0's parameters and buffers.
    EXPECT_TRUE(same_on_all_ranks(comm, state_bytes(*model, /*with_buffers=*/true)));
    EXPECT_TRUE(at::equal(model->shift, at::full({4}, 1.0f)));
    EXPECT_EQ(model->count.item<int64_t>(), 0);

    // A training step, then every rank sets its own buffer values.
    const Batch b = make_batch(6, seed_of(rank, 0), 4, 4);
    torch::mse_loss(ddp(b.x), b.y).backward();
    model->shift.fill_(10.0f * (rank + 1));
    model->count.fill_(100 + rank);
    model->bn->running_mean.fill_(rank + 1.0f);
    model->bn->running_var.fill_(rank + 2.0f);

    // Evaluation forward: BatchNorm reads (and keeps) its running statistics.
    model->eval();
    const Batch e = make_batch(3, 77, 4, 4);  // the same input on every rank
    at::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = ddp(e.x);
    }
    const int source = broadcast ? 0 : rank;
    EXPECT_TRUE(at::equal(model->shift, at::full({4}, 10.0f * (source + 1)))) << "rank " << rank;
    EXPECT_EQ(model->count.item<int64_t>(), 100 + source) << "rank " << rank;
    EXPECT_TRUE(at::equal(model->bn->running_mean, at::full({4}, source + 1.0f)));
    EXPECT_TRUE(at::equal(model->bn->running_var, at::full({4}, source + 2.0f)));
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(out, model->forward(e.x)));
    }
    EXPECT_EQ(same_on_all_ranks(comm, bytes_of(out)),
              broadcast || world == 1);
  }, timeout_of(20s));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelBuffers,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_broadcast" : "_local");
                         });

// ---------------------------------------------------------------------------------------------
// 8. Mismatched models.

class DistributedDataParallelMismatch : public ::testing::TestWithParam<int> {};

// Rank 1 builds `odd`, the others `normal`: every rank's constructor must throw ConfigError whose
// message contains every string of `needles`, without hanging.
void expect_mismatch(int world, const std::function<std::shared_ptr<MlpImpl>()>& normal,
                     const std::function<std::shared_ptr<MlpImpl>()>& odd,
                     const std::vector<std::string>& needles) {
  std::vector<std::shared_ptr<MlpImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(r == 1 ? odd() : normal());
  std::atomic<int> raised{0};
  const auto start = Clock::now();
  run_ranks(world, [&](Communicator& comm) {
    try {
      DistributedDataParallel ddp(models[comm.rank()], borrow(comm));
      ADD_FAILURE() << "rank " << comm.rank() << " accepted a mismatched model";
    } catch (const ConfigError& e) {
      ++raised;
      const std::string msg = e.what();
      for (const auto& needle : needles) {
        EXPECT_NE(msg.find(needle), std::string::npos)
            << "rank " << comm.rank() << " message lacks '" << needle << "': " << msg;
      }
    }
  }, timeout_of(10s));
  EXPECT_EQ(raised.load(), world);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
}

TEST_P(DistributedDataParallelMismatch, DifferentShapeFailsOnEveryRank) {
  expect_mismatch(
      GetParam(), [] { return make_model<MlpImpl>(0); }, [] { return make_model<MlpImpl>(0, 17); },
      {"first difference at parameter #4", "rank 0 'fc2.weight [16, 16] Float cpu'",
       "rank 1 'fc2.weight [17, 16] Float cpu'"});
}

TEST_P(DistributedDataParallelMismatch, DifferentParameterCountFailsOnEveryRank) {
  expect_mismatch(
      GetParam(), [] { return make_model<MlpImpl>(0); },
      [] { return make_model<MlpImpl>(0, 16, true); },
      {"Rank 0 has 7 parameters, rank 1 has 9", "first difference at parameter #7",
       "rank 0 '(none)'", "rank 1 'extra.weight [4, 4] Float cpu'"});
}

TEST_P(DistributedDataParallelMismatch, DifferentDtypeFailsOnEveryRank) {
  expect_mismatch(
      GetParam(), [] { return make_model<MlpImpl>(0); },
      [] {
        auto m = make_model<MlpImpl>(0);
        m->to(torch::kDouble);
        return m;
      },
      {"first difference at parameter #0", "rank 0 'mix [2, 2, 2] Float cpu'",
       "rank 1 'mix [2, 2, 2] Double cpu'"});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelMismatch, ::testing::Values(2, 3, 4),
                         world_name);

// ---------------------------------------------------------------------------------------------
// 9. Skipped backwards.

class DistributedDataParallelSkipped : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_P(DistributedDataParallelSkipped, ForwardsWithoutBackwardDoNotDisturbTheNextStep) {
  const int world = std::get<0>(GetParam());
  const bool find_unused = std::get<1>(GetParam());
  const int64_t n = 4;
  auto reference = make_model<BranchyImpl>(0, /*with_unused=*/find_unused);
  const auto want = averaged_reference(*reference, world, [&](BranchyImpl& m, int r) {
    const Batch b = make_batch(n, seed_of(r, 0), 6, 3);
    return torch::mse_loss(m.forward(b.x, true), b.y);
  });
  const auto models = make_replicas<BranchyImpl>(world, 0, find_unused);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallelOptions options = small_buckets();
    options.find_unused_parameters = find_unused;
    DistributedDataParallel ddp(model, borrow(comm), options);
    const Batch b = make_batch(n, seed_of(comm.rank(), 0), 6, 3);
    int trained = 0;
    for (const std::string action :
         {"skip", "no_grad", "train", "skip", "train", "no_grad", "skip", "train"}) {
      const std::string where = "rank " + std::to_string(comm.rank()) + " " + action +
                                " after " + std::to_string(trained) + " steps";
      if (action == "skip") {
        auto out = ddp(b.x, true);
        EXPECT_TRUE(out.requires_grad());
      } else if (action == "no_grad") {
        torch::NoGradGuard no_grad;
        EXPECT_TRUE(at::equal(ddp(b.x, true), model->forward(b.x, true))) << where;
      } else {
        torch::mse_loss(ddp(b.x, true), b.y).backward();
        expect_grads(*model, want, world == 1, where);
        model->zero_grad();
        ++trained;
      }
    }
    EXPECT_TRUE(ddp.reducer().buckets_rebuilt());
  }, timeout_of(20s));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelSkipped,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_find_unused" : "_all_used");
                         });

// ---------------------------------------------------------------------------------------------
// Construction errors and module holders.

TEST(DistributedDataParallel, NullModuleOrCommunicatorIsAConfigError) {
  run_ranks(1, [](Communicator& comm) {
    EXPECT_THROW(DistributedDataParallel(std::shared_ptr<MlpImpl>(), borrow(comm)), ConfigError);
    EXPECT_THROW(
        DistributedDataParallel(std::make_shared<MlpImpl>(), std::shared_ptr<Communicator>()),
        ConfigError);
    DistributedDataParallelOptions zero_cap;
    zero_cap.bucket_cap_mb = 0;
    EXPECT_THROW(DistributedDataParallel(std::make_shared<MlpImpl>(), borrow(comm), zero_cap),
                 ConfigError);
  });
}

TEST(DistributedDataParallel, AcceptsModuleHoldersAndSkipsFrozenParameters) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::Sequential seq(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  seq[0]->as<torch::nn::Linear>()->weight.set_requires_grad(false);  // frozen
  const auto x = at::randn({5, 3});
  run_ranks(1, [&](Communicator& comm) {
    DistributedDataParallel ddp(seq, borrow(comm));
    EXPECT_EQ(ddp.reducer().parameter_names(),
              (std::vector<std::string>{"0.bias", "2.weight", "2.bias"}));
    ddp(x).sum().backward();
    EXPECT_FALSE(seq[0]->as<torch::nn::Linear>()->weight.grad().defined());
    EXPECT_TRUE(seq[0]->as<torch::nn::Linear>()->bias.grad().defined());
  });
}

// ddp.overlap = false launches every bucket after backward: the same sums in the same bucket
// order, so the same bits as overlapping.
TEST(DistributedDataParallelEdge, WithoutOverlapTheGradientsAreBitwiseTheSame) {
  std::vector<std::vector<at::Tensor>> grads(2);
  for (const auto overlap : {DistributedDataParallelOptions::Overlap::kOn, DistributedDataParallelOptions::Overlap::kOff}) {
    const auto models = make_replicas<MlpImpl>(2, 0);
    std::vector<std::vector<at::Tensor>> per_rank(2);
    run_ranks(2, [&](Communicator& comm) {
      DistributedDataParallelOptions options = small_buckets();
      options.overlap = overlap;
      DistributedDataParallel ddp(models[comm.rank()], borrow(comm), options);
      for (int step = 0; step < 3; ++step) {  // the rebuilt plan too
        models[comm.rank()]->zero_grad();
        const Batch b = make_batch(6, seed_of(comm.rank(), step));
        torch::mse_loss(ddp(b.x), b.y).backward();
      }
      per_rank[comm.rank()] = grads_of(*models[comm.rank()]);
    }, timeout_of(20s));
    grads[overlap == DistributedDataParallelOptions::Overlap::kOn ? 0 : 1] = per_rank[1];
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << i;
}

// ddp.overlap=auto keeps the CPU heuristic (a spare core per rank) for CPU models only: a model on
// a GPU always overlaps, whatever the host's cores (issue 37: it was switched off over NCCL too).
TEST(DistributedDataParallelEdge, AutoOverlapAlwaysOverlapsOnAGpuAndAsksForASpareCoreOnTheCpu) {
  using Overlap = DistributedDataParallelOptions::Overlap;
  run_ranks(1, [&](Communicator& comm) {
    const c10::Device cuda(c10::kCUDA, 0), cpu(c10::kCPU);
    EXPECT_TRUE(overlap_pays(Overlap::kAuto, comm, cuda));
    EXPECT_FALSE(overlap_pays(Overlap::kOff, comm, cuda));
    EXPECT_TRUE(overlap_pays(Overlap::kOn, comm, cpu));
    // More compute threads than cores: no core is left for communication on the CPU.
    const int threads = at::get_num_threads();
    at::set_num_threads(static_cast<int>(std::thread::hardware_concurrency()) + 1);
    const bool cpu_pays = overlap_pays(Overlap::kAuto, comm, cpu);
    const bool cuda_pays = overlap_pays(Overlap::kAuto, comm, cuda);
    at::set_num_threads(threads);
    EXPECT_FALSE(cpu_pays);
    EXPECT_TRUE(cuda_pays);
  });
}

}  // namespace
}  // namespace tandem
