// DistributedDataParallel for world sizes 1-4, ranks as threads: averaged gradients against
// single-process references, replicas bitwise equal after training, the one-time bucket rebuild,
// gradient_as_bucket_view, no_sync, custom codecs and construction. Edge cases (unused
// parameters, buffers, mismatched models, skipped backwards) are in data_parallel_edge_test.cpp.
#include "tests/unit/data_parallel_test_util.h"

namespace tandem {
namespace {

// Every parameter index in exactly one bucket, each bucket of one dtype.
void expect_valid_plan(const std::vector<std::vector<int64_t>>& plan,
                       const std::vector<at::Tensor>& params, const std::string& where) {
  std::vector<int> seen(params.size(), 0);
  for (const auto& bucket : plan) {
    ASSERT_FALSE(bucket.empty()) << where;
    for (int64_t p : bucket) {
      ASSERT_GE(p, 0) << where;
      ASSERT_LT(p, static_cast<int64_t>(params.size())) << where;
      ++seen[p];
      EXPECT_EQ(params[p].scalar_type(), params[bucket.front()].scalar_type())
          << where << ": bucket mixes dtypes";
    }
  }
  for (size_t p = 0; p < params.size(); ++p) {
    EXPECT_EQ(seen[p], 1) << where << ": parameter " << p << " is in " << seen[p] << " buckets";
  }
}

at::Tensor flat_plan(const std::vector<std::vector<int64_t>>& plan) {
  std::vector<int64_t> flat;
  for (const auto& b : plan) {
    flat.push_back(-1);
    flat.insert(flat.end(), b.begin(), b.end());
  }
  return at::tensor(flat, at::kLong);
}

// ---------------------------------------------------------------------------------------------
// 1. One step equals the single-process full batch.

TEST_P(DistributedDataParallelWorlds, OneStepEqualsSingleProcessFullBatch) {
  const int world = GetParam();
  const int64_t global_batch = 24;
  const Batch data = make_batch(global_batch, 7);
  auto reference = make_model<MlpImpl>(0);
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  const auto want = grads_of(*reference);
  const auto models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallel ddp(model, borrow(comm), small_buckets());
    EXPECT_GT(ddp.reducer().bucket_plan().size(), 2u);
    expect_valid_plan(ddp.reducer().bucket_plan(), model->parameters(), "initial plan");
    const int64_t n = global_batch / world;
    const Batch local = data.rows(comm.rank() * n, n);
    auto out = ddp(local.x);
    EXPECT_TRUE(at::equal(out, model->forward(local.x)));  // forward is the module's own
    torch::mse_loss(out, local.y).backward();
    expect_grads(*model, want, /*exact=*/world == 1, "rank " + std::to_string(comm.rank()));
  }, timeout_of(20s));
}

// ---------------------------------------------------------------------------------------------
// 2. Training keeps the replicas bitwise equal.

TEST_P(DistributedDataParallelWorlds, TwentySgdStepsKeepReplicasBitwiseEqual) {
  const int world = GetParam();
  std::vector<std::shared_ptr<MlpImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model<MlpImpl>(100 + r));  // differ

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallel ddp(model, borrow(comm), small_buckets());
    EXPECT_TRUE(same_on_all_ranks(comm, state_bytes(*model))) << "after construction";
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 20; ++step) {
      const Batch b = make_batch(6, seed_of(comm.rank(), step));
      torch::mse_loss(ddp(b.x), b.y).backward();
      opt.step();
      opt.zero_grad();
      EXPECT_TRUE(same_on_all_ranks(comm, state_bytes(*model))) << "after step " << step;
    }
  }, timeout_of(20s));
}

// ---------------------------------------------------------------------------------------------
// 3. The one-time bucket rebuild.

TEST_P(DistributedDataParallelWorlds, BucketsRebuildOnceAndResultsStayCorrect) {
  const int world = GetParam();
  const Batch data = make_batch(12, 11);
  auto reference = make_model<MlpImpl>(0);
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  const auto want = grads_of(*reference);
  const auto models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallel ddp(model, borrow(comm), small_buckets());
    const int64_t n = 12 / world;
    const Batch local = data.rows(comm.rank() * n, n);
    for (int iter = 0; iter < 3; ++iter) {
      auto out = ddp(local.x);
      EXPECT_EQ(ddp.reducer().buckets_rebuilt(), iter >= 1) << "after forward " << iter;
      torch::mse_loss(out, local.y).backward();
      EXPECT_EQ(ddp.reducer().buckets_rebuilt(), iter >= 1) << "after backward " << iter;
      const std::string where = "rank " + std::to_string(comm.rank()) + " iteration " +
                                std::to_string(iter);
      expect_grads(*model, want, world == 1, where);
      const auto plan = ddp.reducer().bucket_plan();
      expect_valid_plan(plan, model->parameters(), where);
      EXPECT_GT(plan.size(), 2u);
      EXPECT_TRUE(same_on_all_ranks(comm, bytes_of(flat_plan(plan)))) << where;
      model->zero_grad();
    }
  }, timeout_of(20s));
}

TEST_P(DistributedDataParallelWorlds, RebuildTakesRankZerosGradientOrder) {
  // Rank 0 evaluates branch a first, the others b first: their first backwards see different
  // gradient orders, yet every rank must build rank 0's plan.
  const int world = GetParam();
  const Batch data = make_batch(8, 3);
  auto reference = make_model<TwoBranchImpl>(0);
  const int64_t n = 8 / world;
  const auto want = averaged_reference(*reference, world, [&](TwoBranchImpl& m, int r) {
    const Batch local = data.rows(r * n, n);
    return torch::mse_loss(m.forward(local.x, r == 0), local.y);
  });
  const auto models = make_replicas<TwoBranchImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallelOptions options;
    options.bucket_cap_mb = 1e-6;  // one parameter per bucket
    options.first_bucket_cap_mb = 1e-6;
    DistributedDataParallel ddp(model, borrow(comm), options);
    const Batch local = data.rows(comm.rank() * n, n);
    for (int iter = 0; iter < 3; ++iter) {
      torch::mse_loss(ddp(local.x, comm.rank() == 0), local.y).backward();
      const std::string where = "rank " + std::to_string(comm.rank()) + " iteration " +
                                std::to_string(iter);
      const auto plan = ddp.reducer().bucket_plan();
      EXPECT_TRUE(same_on_all_ranks(comm, bytes_of(flat_plan(plan)))) << where;
      expect_valid_plan(plan, model->parameters(), where);
      expect_grads(*model, want, false, where);
      model->zero_grad();
    }
    EXPECT_TRUE(ddp.reducer().buckets_rebuilt());
  }, timeout_of(20s));
}

// ---------------------------------------------------------------------------------------------
// 4. gradient_as_bucket_view.

TEST_P(DistributedDataParallelWorlds, GradientAsBucketViewMatchesCopiesAndKeepsGradsInBuckets) {
  const int world = GetParam();
  const auto plain_models = make_replicas<MlpImpl>(world, 0);
  const auto view_models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto plain_model = plain_models[rank];
    auto view_model = view_models[rank];
    DistributedDataParallelOptions copies = small_buckets();
    copies.gradient_as_bucket_view = false;
    DistributedDataParallel plain(plain_model, borrow(comm), copies);
    auto codec = std::make_shared<RecordingCodec>();
    DistributedDataParallelOptions options = small_buckets();
    options.gradient_as_bucket_view = true;
    options.codec = codec;
    DistributedDataParallel view(view_model, borrow(comm), options);
    torch::optim::SGD plain_opt(plain_model->parameters(),
                                torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD view_opt(view_model->parameters(),
                               torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto plain_params = plain_model->parameters();
    const auto view_params = view_model->parameters();
    std::vector<const void*> grad_ptrs;  // after the rebuild (second forward)
    for (int step = 0; step < 6; ++step) {
      const std::string where = "rank " + std::to_string(rank) + " step " + std::to_string(step);
      const Batch b = make_batch(5, seed_of(rank, step));
      torch::mse_loss(plain(b.x), b.y).backward();
      torch::mse_loss(view(b.x), b.y).backward();
      const auto calls = codec->take();
      EXPECT_EQ(calls.size(), view.reducer().bucket_plan().size()) << where;
      for (size_t i = 0; i < view_params.size(); ++i) {
        const at::Tensor& g = view_params[i].grad();
        ASSERT_TRUE(g.defined()) << where;
        EXPECT_TRUE(at::equal(g, plain_params[i].grad())) << where << " parameter " << i;
        const bool in_bucket = std::any_of(calls.begin(), calls.end(), [&](const BucketCall& c) {
          return g.is_alias_of(c.buffer);
        });
        EXPECT_TRUE(in_bucket) << where << ": grad of parameter " << i
                               << " is not a view of a bucket";
        if (step == 1) grad_ptrs.push_back(g.data_ptr());
        if (step > 1) {
          EXPECT_EQ(g.data_ptr(), grad_ptrs[i]) << where << " parameter " << i;
        }
      }
      plain_opt.step();
      view_opt.step();
      plain_opt.zero_grad();
      view_opt.zero_grad();
      for (size_t i = 0; i < view_params.size(); ++i) {
        const at::Tensor& g = view_params[i].grad();
        if (!g.defined()) continue;  // libtorch 2.x zero_grad() sets grads to None
        EXPECT_EQ(g.count_nonzero().item<int64_t>(), 0) << where << " after zero_grad";
        if (step >= 1) {
          EXPECT_EQ(g.data_ptr(), grad_ptrs[i]) << where << " after zero_grad";
        }
      }
      EXPECT_TRUE(at::equal(state_bytes(*plain_model), state_bytes(*view_model))) << where;
    }
    EXPECT_TRUE(same_on_all_ranks(comm, state_bytes(*view_model)));
  }, timeout_of(20s));
}

TEST_P(DistributedDataParallelWorlds, WithoutFindUnusedTheNextForwardNamesTheUnusedParameters) {
  // The layer `unused` takes no part on any rank: every rank launches the same (no) buckets and
  // raises at its next forward, naming the parameters that never became ready.
  const int world = GetParam();
  const auto models = make_replicas<BranchyImpl>(world, 0);
  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallel ddp(model, borrow(comm), small_buckets());
    const Batch b = make_batch(4, seed_of(comm.rank(), 0), 6, 3);
    const auto start = Clock::now();
    torch::mse_loss(ddp(b.x, true), b.y).backward();
    try {
      ddp(b.x, true);
      ADD_FAILURE() << "rank " << comm.rank() << ": no error at the next forward";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("unused.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unused.bias"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--set ddp.find_unused_parameters=true"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("trunk."), std::string::npos) << msg;
      EXPECT_EQ(msg.find("head."), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.0);
  }, timeout_of(2s));
}

// ---------------------------------------------------------------------------------------------
// 6. no_sync.

TEST_P(DistributedDataParallelWorlds, NoSyncMicroStepsThenSyncEqualOneFullBatchStep) {
  const int world = GetParam();
  const int micro = 4;  // 3 under no_sync, 1 synchronised
  const int64_t m_rows = 3;
  // Global batch: rank r's micro-batch m is rows [(r * micro + m) * m_rows, ...).
  const Batch data = make_batch(world * micro * m_rows, 5);
  auto reference = make_model<MlpImpl>(0);
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  const auto want = grads_of(*reference);
  const auto models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    auto codec = std::make_shared<RecordingCodec>();
    DistributedDataParallelOptions options = small_buckets();
    options.codec = codec;
    DistributedDataParallel ddp(model, borrow(comm), options);
    auto micro_batch = [&](int m) { return data.rows((comm.rank() * micro + m) * m_rows, m_rows); };
    for (int round = 0; round < 2; ++round) {
      {
        auto guard = ddp.no_sync();
        for (int m = 0; m + 1 < micro; ++m) {
          const Batch b = micro_batch(m);
          (torch::mse_loss(ddp(b.x), b.y) / double(micro)).backward();
        }
      }
      EXPECT_TRUE(codec->take().empty()) << "no_sync must not communicate gradients";
      const Batch b = micro_batch(micro - 1);
      (torch::mse_loss(ddp(b.x), b.y) / double(micro)).backward();
      EXPECT_EQ(codec->take().size(), ddp.reducer().bucket_plan().size());
      expect_grads(*model, want, false,
                   "rank " + std::to_string(comm.rank()) + " round " + std::to_string(round));
      model->zero_grad();
    }
  }, timeout_of(20s));
}

TEST_P(DistributedDataParallelWorlds, SkippedBackwardWithABranchUnusedOnSomeRanks) {
  // find_unused_parameters with a branch only even ranks use; the first forward is not followed
  // by backward (e.g. an evaluation in grad mode), then training goes on.
  const int world = GetParam();
  const int64_t n = 4;
  auto uses_branch = [](int rank) { return rank % 2 == 0; };
  auto reference = make_model<BranchyImpl>(0, true, /*branch_last=*/true);
  const auto want = averaged_reference(*reference, world, [&](BranchyImpl& m, int r) {
    const Batch b = make_batch(n, seed_of(r, 0), 6, 3);
    return torch::mse_loss(m.forward(b.x, uses_branch(r)), b.y);
  });
  const auto models = make_replicas<BranchyImpl>(world, 0, true, true);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallelOptions options;
    options.bucket_cap_mb = 1e-6;  // one parameter per bucket
    options.first_bucket_cap_mb = 1e-6;
    options.find_unused_parameters = true;
    DistributedDataParallel ddp(model, borrow(comm), options);
    const Batch b = make_batch(n, seed_of(comm.rank(), 0), 6, 3);
    ddp(b.x, uses_branch(comm.rank()));  // no backward
    for (int iter = 0; iter < 2; ++iter) {
      torch::mse_loss(ddp(b.x, uses_branch(comm.rank())), b.y).backward();
      expect_grads(*model, want, world == 1,
                   "rank " + std::to_string(comm.rank()) + " iteration " + std::to_string(iter));
      model->zero_grad();
    }
  }, timeout_of(5s));
}

// ---------------------------------------------------------------------------------------------
// 10. Codec hook.

TEST_P(DistributedDataParallelWorlds, CodecSeesEveryBucketEveryStepAndAveragingStillHolds) {
  const int world = GetParam();
  const int64_t global_batch = 12;
  const Batch data = make_batch(global_batch, 13);
  auto reference = make_model<MlpImpl>(0);
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  const auto want = grads_of(*reference);
  const auto models = make_replicas<MlpImpl>(world, 0);

  for (const bool sum_then_divide : {false, true}) {
    run_ranks(world, [&](Communicator& comm) {
      auto model = models[comm.rank()];
      model->zero_grad();
      auto codec = std::make_shared<RecordingCodec>(sum_then_divide);
      DistributedDataParallelOptions options = small_buckets();
      options.codec = codec;
      DistributedDataParallel ddp(model, borrow(comm), options);
      EXPECT_EQ(&ddp.reducer().codec(), codec.get());
      const auto params = model->parameters();
      const int64_t n = global_batch / world;
      const Batch local = data.rows(comm.rank() * n, n);
      for (int step = 0; step < 3; ++step) {
        const std::string where = std::string(sum_then_divide ? "sum/size" : "average") +
                                  " rank " + std::to_string(comm.rank()) + " step " +
                                  std::to_string(step);
        torch::mse_loss(ddp(local.x), local.y).backward();
        const auto calls = codec->take();
        const auto plan = ddp.reducer().bucket_plan();
        ASSERT_EQ(calls.size(), plan.size()) << where;
        std::vector<int> seen(params.size(), 0);
        for (size_t i = 0; i < calls.size(); ++i) {
          const BucketCall& c = calls[i];
          EXPECT_EQ(c.index, static_cast<int64_t>(i)) << where << ": buckets out of order";
          EXPECT_EQ(c.step, step) << where;
          EXPECT_EQ(c.params, plan[i]) << where;
          ASSERT_EQ(c.offsets.size(), c.params.size()) << where;
          ASSERT_EQ(c.shapes.size(), c.params.size()) << where;
          // Each parameter at the first offset after the one before that is as aligned as a
          // CPU tensor of its own (64 bytes).
          int64_t offset = 0;
          const int64_t aligned = 64 / static_cast<int64_t>(c.buffer.element_size());
          for (size_t k = 0; k < c.params.size(); ++k) {
            const at::Tensor& p = params.at(c.params[k]);
            ++seen[c.params[k]];
            offset = (offset + aligned - 1) / aligned * aligned;
            EXPECT_EQ(c.offsets[k], offset) << where;
            EXPECT_EQ(c.shapes[k], p.sizes().vec()) << where;
            EXPECT_EQ(c.buffer.scalar_type(), p.scalar_type()) << where;
            offset += p.numel();
          }
          EXPECT_EQ(c.buffer.numel(), offset) << where;
          EXPECT_EQ(c.buffer.dim(), 1) << where;
        }
        for (size_t p = 0; p < params.size(); ++p) EXPECT_EQ(seen[p], 1) << where;
        expect_grads(*model, want, world == 1, where);
        model->zero_grad();
      }
    }, timeout_of(20s));
  }
}

TEST_P(DistributedDataParallelWorlds, ConstructionMakesEveryParameterEqualFrozenOnesIncluded) {
  // Replicas built with different seeds, one layer frozen (requires_grad = false, as when
  // fine-tuning): after construction every replica must hold rank 0's parameters, all of them.
  const int world = GetParam();
  std::vector<std::shared_ptr<MlpImpl>> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(make_model<MlpImpl>(200 + r));
    models.back()->fc1->weight.set_requires_grad(false);
  }
  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DistributedDataParallel ddp(model, borrow(comm), small_buckets());
    EXPECT_EQ(ddp.reducer().parameter_names().size(), model->parameters().size() - 1);
    EXPECT_TRUE(same_on_all_ranks(comm, state_bytes(*model)))
        << "rank " << comm.rank() << ": replicas differ after construction";
    EXPECT_TRUE(same_on_all_ranks(comm, bytes_of(model->fc1->weight)))
        << "rank " << comm.rank() << ": frozen fc1.weight differs across ranks";
  }, timeout_of(20s));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DistributedDataParallelWorlds, ::testing::Values(1, 2, 3, 4),
                         world_name);

}  // namespace
}  // namespace tandem
