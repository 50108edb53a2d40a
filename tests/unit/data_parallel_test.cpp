// DataParallel with ranks as threads over one HashStore: averaged gradients against
// single-process references, replicas bitwise equal after training, the one-time bucket rebuild,
// gradient_as_bucket_view, unused parameters, no_sync, buffers, mismatched models, skipped
// backwards and custom codecs, for world sizes 1-4.
//
// Models and data are made on the test's main thread (torch::manual_seed is process-global, so
// seeding from rank threads would race); rank threads only run DataParallel.
#include "test_support.h"

#include <tandem/errors.h>
#include <tandem/runtime/data_parallel.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>

namespace tandem {
namespace {

using testing::run_ranks;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int64_t kIn = 8;
constexpr int64_t kOut = 4;

// ---------------------------------------------------------------------------------------------
// Models

// Three Linear layers with ReLU (the last one bias-free), a 3-d parameter and a float64
// parameter: several shapes and two dtypes in the buckets. `hidden2` and `extra_param` make the
// mismatched variants. Parameter order (named_parameters: own first, then children): mix, gain,
// fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight[, extra.weight, extra.bias].
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden2 = 16, bool extra_param = false) {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, hidden2));
    fc3 = register_module("fc3",
                          torch::nn::Linear(torch::nn::LinearOptions(hidden2, 8).bias(false)));
    mix = register_parameter("mix", torch::randn({2, 2, 2}));
    gain = register_parameter("gain", torch::rand({kOut}, torch::kDouble) + 0.5);
    if (extra_param) extra = register_module("extra", torch::nn::Linear(kOut, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x));
    h = torch::relu(fc2(h));
    h = (fc3(h).view({-1, 2, 2, 2}) * mix).sum(-1);  // [B, 2, 2]
    auto y = h.reshape({-1, kOut}) * gain.to(torch::kFloat);
    return extra ? extra(y) : y;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, extra{nullptr};
  torch::Tensor mix, gain;
};

// A trunk and a head always used, a branch used when the forward's flag says so, and (optionally)
// a layer no forward ever uses. `branch_last` registers the branch after everything else, which
// puts it in the first bucket of the initial (reverse registration order) plan.
struct BranchyImpl : torch::nn::Module {
  explicit BranchyImpl(bool with_unused = true, bool branch_last = false) {
    trunk = register_module("trunk", torch::nn::Linear(6, 8));
    if (!branch_last) branch = register_module("branch", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 3));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(8, 8));
    if (branch_last) branch = register_module("branch", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_branch) {
    auto h = torch::relu(trunk(x));
    if (use_branch) h = h + torch::tanh(branch(h));
    return head(h);
  }
  torch::nn::Linear trunk{nullptr}, branch{nullptr}, head{nullptr}, unused{nullptr};
};

// Two branches whose order of evaluation the caller picks, so ranks can observe different
// gradient orders in their first backward.
struct TwoBranchImpl : torch::nn::Module {
  TwoBranchImpl() {
    a = register_module("a", torch::nn::Linear(kIn, kOut));
    b = register_module("b", torch::nn::Linear(kIn, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x, bool a_first) {
    if (a_first) {
      auto ya = a(x);
      return ya + b(x);
    }
    auto yb = b(x);
    return a(x) + yb;
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// A module with buffers of two dtypes: its own, plus BatchNorm's running statistics.
struct WithBuffersImpl : torch::nn::Module {
  WithBuffersImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
    shift = register_buffer("shift", torch::zeros({4}));
    count = register_buffer("count", torch::zeros({1}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)) + shift; }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::Tensor shift, count;
};

template <class M, class... Args>
std::shared_ptr<M> make_model(uint64_t seed, Args&&... args) {
  torch::manual_seed(seed);
  return std::make_shared<M>(std::forward<Args>(args)...);
}

template <class M, class... Args>
std::vector<std::shared_ptr<M>> make_replicas(int world, uint64_t seed, Args... args) {
  std::vector<std::shared_ptr<M>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model<M>(seed, args...));
  return models;
}

// ---------------------------------------------------------------------------------------------
// Data, references, comparisons

struct Batch {
  at::Tensor x, y;
  Batch rows(int64_t start, int64_t n) const {
    return {x.narrow(0, start, n), y.narrow(0, start, n)};
  }
};

// Independent of the global generator, so rank threads may call it.
Batch make_batch(int64_t n, uint64_t seed, int64_t in = kIn, int64_t out = kOut) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto x = at::randn({n, in}, gen);
  auto y = at::randn({n, out}, gen);
  return {x, y};
}

uint64_t seed_of(int rank, int step) { return 1000 + 97 * static_cast<uint64_t>(rank) + step; }

std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

GlooOptions timeout_of(std::chrono::milliseconds timeout) {
  GlooOptions options;
  options.timeout = timeout;
  return options;
}

// Several buckets for the tiny models here (the first closes at 209 bytes, the others at 1 KiB).
DataParallelOptions small_buckets() {
  DataParallelOptions options;
  options.bucket_cap_mb = 0.001;
  options.first_bucket_cap_mb = 0.0002;
  return options;
}

// Gradients of every parameter (undefined where the parameter has none), in parameter order.
std::vector<at::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<at::Tensor> grads;
  for (const auto& p : m.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().detach().clone() : at::Tensor());
  }
  return grads;
}

// Gradients of sum_r loss(model, r) / world in one process: what DataParallel's average of the
// ranks' local gradients must equal.
template <class M, class LossOfRank>
std::vector<at::Tensor> averaged_reference(M& model, int world, LossOfRank loss_of_rank) {
  model.zero_grad();
  torch::Tensor total;
  for (int r = 0; r < world; ++r) {
    auto l = loss_of_rank(model, r) / static_cast<double>(world);
    total = total.defined() ? total + l : l;
  }
  total.backward();
  auto grads = grads_of(model);
  for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  return grads;
}

double rel_error(const at::Tensor& got, const at::Tensor& want) {
  const auto g = got.to(at::kDouble);
  const auto w = want.to(at::kDouble);
  const double diff = (g - w).norm().item<double>();
  const double norm = w.norm().item<double>();
  return norm == 0 ? diff : diff / norm;
}

// Each parameter's gradient against `want` (undefined: the parameter must have no gradient):
// bitwise with `exact`, else relative error <= 1e-6.
void expect_grads(torch::nn::Module& m, const std::vector<at::Tensor>& want, bool exact,
                  const std::string& where) {
  const auto named = m.named_parameters();
  ASSERT_EQ(named.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string& name = named[i].key();
    const at::Tensor grad = named[i].value().grad();
    if (!want[i].defined()) {
      EXPECT_FALSE(grad.defined()) << where << ": " << name << " should have no gradient";
      continue;
    }
    if (!grad.defined()) {
      ADD_FAILURE() << where << ": " << name << " has no gradient";
      continue;
    }
    ASSERT_EQ(grad.sizes(), want[i].sizes()) << where << ": " << name;
    if (exact) {
      EXPECT_TRUE(at::equal(grad, want[i]))
          << where << ": " << name << " differs by up to "
          << (grad.to(at::kDouble) - want[i].to(at::kDouble)).abs().max().item<double>();
    } else {
      EXPECT_LE(rel_error(grad, want[i]), 1e-6) << where << ": " << name;
    }
  }
}

at::Tensor bytes_of(const at::Tensor& t) {
  return t.detach().contiguous().view({-1}).view(at::kByte);
}

// The raw bytes of every parameter (and buffer), concatenated.
at::Tensor state_bytes(torch::nn::Module& m, bool with_buffers = false) {
  std::vector<at::Tensor> parts;
  auto add = [&](const at::Tensor& t) { parts.push_back(bytes_of(t)); };
  for (const auto& p : m.parameters()) add(p);
  if (with_buffers) {
    for (const auto& b : m.buffers()) add(b);
  }
  return at::cat(parts);
}

// True when every rank passed the same bytes (collective).
bool same_on_all_ranks(Communicator& comm, const at::Tensor& bytes) {
  const int64_t n = bytes.numel();
  auto all = at::empty({comm.size() * n}, at::kByte);
  comm.allgather(all, bytes)->wait();
  for (int r = 0; r < comm.size(); ++r) {
    if (!at::equal(all.narrow(0, r * n, n), bytes)) return false;
  }
  return true;
}

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
// A codec that records every bucket it is handed, then averages (by default through the stock
// codec; with `sum_then_divide`, by a sum all-reduce whose Work divides when waited on).

struct BucketCall {
  int64_t index = 0;
  int64_t step = 0;
  std::vector<int64_t> params;
  std::vector<int64_t> offsets;
  std::vector<std::vector<int64_t>> shapes;
  at::Tensor buffer;  // shares the bucket's memory
};

class DividingWork : public Work {
 public:
  DividingWork(WorkPtr inner, at::Tensor buffer, int size)
      : inner_(std::move(inner)), buffer_(std::move(buffer)), size_(size) {}
  void wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    if (!divided_) {
      buffer_.div_(size_);
      divided_ = true;
    }
  }
  bool is_completed() override { return divided_; }
  std::string describe() const override { return "sum / size: " + inner_->describe(); }

 private:
  WorkPtr inner_;
  at::Tensor buffer_;
  int size_;
  bool divided_ = false;
};

class RecordingCodec : public GradCodec {
 public:
  explicit RecordingCodec(bool sum_then_divide = false) : sum_then_divide_(sum_then_divide) {}
  std::string name() const override { return "recording"; }

 protected:
  WorkPtr encode_and_reduce(Communicator& comm, GradBucket& bucket) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      calls_.push_back({bucket.index, bucket.step, bucket.param_indices, bucket.offsets,
                        bucket.shapes, bucket.buffer});
    }
    if (!sum_then_divide_) return inner_->reduce(comm, bucket);
    return std::make_shared<DividingWork>(comm.allreduce(bucket.buffer, ReduceOp::kSum),
                                          bucket.buffer, comm.size());
  }

 public:
  // The calls since the last take().
  std::vector<BucketCall> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(calls_, {});
  }

 private:
  bool sum_then_divide_;
  std::shared_ptr<GradCodec> inner_ = make_average_codec();
  std::mutex mutex_;
  std::vector<BucketCall> calls_;
};

std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "world" + std::to_string(info.param);
}

class DataParallelWorlds : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

// ---------------------------------------------------------------------------------------------
// 1. One step equals the single-process full batch.

TEST_P(DataParallelWorlds, OneStepEqualsSingleProcessFullBatch) {
  const int world = GetParam();
  const int64_t global_batch = 24;
  const Batch data = make_batch(global_batch, 7);
  auto reference = make_model<MlpImpl>(0);
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  const auto want = grads_of(*reference);
  const auto models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DataParallel ddp(model, borrow(comm), small_buckets());
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

TEST_P(DataParallelWorlds, TwentySgdStepsKeepReplicasBitwiseEqual) {
  const int world = GetParam();
  std::vector<std::shared_ptr<MlpImpl>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model<MlpImpl>(100 + r));  // differ

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DataParallel ddp(model, borrow(comm), small_buckets());
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

TEST_P(DataParallelWorlds, BucketsRebuildOnceAndResultsStayCorrect) {
  const int world = GetParam();
  const Batch data = make_batch(12, 11);
  auto reference = make_model<MlpImpl>(0);
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  const auto want = grads_of(*reference);
  const auto models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DataParallel ddp(model, borrow(comm), small_buckets());
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

TEST_P(DataParallelWorlds, RebuildTakesRankZerosGradientOrder) {
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
    DataParallelOptions options;
    options.bucket_cap_mb = 1e-6;  // one parameter per bucket
    options.first_bucket_cap_mb = 1e-6;
    DataParallel ddp(model, borrow(comm), options);
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

TEST_P(DataParallelWorlds, GradientAsBucketViewMatchesCopiesAndKeepsGradsInBuckets) {
  const int world = GetParam();
  const auto plain_models = make_replicas<MlpImpl>(world, 0);
  const auto view_models = make_replicas<MlpImpl>(world, 0);

  run_ranks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto plain_model = plain_models[rank];
    auto view_model = view_models[rank];
    DataParallelOptions copies = small_buckets();
    copies.gradient_as_bucket_view = false;
    DataParallel plain(plain_model, borrow(comm), copies);
    auto codec = std::make_shared<RecordingCodec>();
    DataParallelOptions options = small_buckets();
    options.gradient_as_bucket_view = true;
    options.codec = codec;
    DataParallel view(view_model, borrow(comm), options);
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

// ---------------------------------------------------------------------------------------------
// 5. Unused parameters. Parametrised by world size and gradient_as_bucket_view.

class DataParallelUnused : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

std::string unused_name(const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
  return "world" + std::to_string(std::get<0>(info.param)) +
         (std::get<1>(info.param) ? "_view" : "_copy");
}

TEST_P(DataParallelUnused, BranchUsedOnSomeRanksIsAveragedAndGloballyUnusedStaysUndefined) {
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
    DataParallelOptions options = small_buckets();
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = as_view;
    DataParallel ddp(model, borrow(comm), options);
    const Batch b = make_batch(n, seed_of(comm.rank(), 0), 6, 3);
    for (int iter = 0; iter < 3; ++iter) {  // before and after the rebuild
      torch::mse_loss(ddp(b.x, uses_branch(comm.rank())), b.y).backward();
      expect_grads(*model, want, world == 1,
                   "rank " + std::to_string(comm.rank()) + " iteration " + std::to_string(iter));
      model->zero_grad();
    }
  }, timeout_of(20s));
}

TEST_P(DataParallelUnused, NoSyncAccumulationReducesParametersUsedOnlyInEarlierMicroSteps) {
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
    DataParallelOptions options = small_buckets();
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = as_view;
    options.codec = codec;
    DataParallel ddp(model, borrow(comm), options);
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

TEST_P(DataParallelUnused, ForwardWithoutBackwardLeavesExistingGradsAlone) {
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
    DataParallelOptions options = small_buckets();
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = as_view;
    DataParallel ddp(model, borrow(comm), options);
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

INSTANTIATE_TEST_SUITE_P(WorldSizes, DataParallelUnused,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         unused_name);

TEST_P(DataParallelWorlds, WithoutFindUnusedTheNextForwardNamesTheUnusedParameters) {
  // The layer `unused` takes no part on any rank: every rank launches the same (no) buckets and
  // raises at its next forward, naming the parameters that never became ready.
  const int world = GetParam();
  const auto models = make_replicas<BranchyImpl>(world, 0);
  run_ranks(world, [&](Communicator& comm) {
    auto model = models[comm.rank()];
    DataParallel ddp(model, borrow(comm), small_buckets());
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
      EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("trunk."), std::string::npos) << msg;
      EXPECT_EQ(msg.find("head."), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.0);
  }, timeout_of(2s));
}

// ---------------------------------------------------------------------------------------------
// 6. no_sync.

TEST_P(DataParallelWorlds, NoSyncMicroStepsThenSyncEqualOneFullBatchStep) {
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
    DataParallelOptions options = small_buckets();
    options.codec = codec;
    DataParallel ddp(model, borrow(comm), options);
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

// ---------------------------------------------------------------------------------------------
// 7. Buffers.

class DataParallelBuffers : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_P(DataParallelBuffers, ForwardBroadcastsRankZerosBuffersOnlyWhenAsked) {
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
    DataParallelOptions options;
    options.broadcast_buffers = broadcast;
    DataParallel ddp(model, borrow(comm), options);
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

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, DataParallelBuffers,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
    [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_broadcast" : "_local");
    });

// ---------------------------------------------------------------------------------------------
// 8. Mismatched models.

class DataParallelMismatch : public ::testing::TestWithParam<int> {};

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
      DataParallel ddp(models[comm.rank()], borrow(comm));
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

TEST_P(DataParallelMismatch, DifferentShapeFailsOnEveryRank) {
  expect_mismatch(
      GetParam(), [] { return make_model<MlpImpl>(0); }, [] { return make_model<MlpImpl>(0, 17); },
      {"first difference at parameter #4", "rank 0 'fc2.weight [16, 16] Float'",
       "rank 1 'fc2.weight [17, 16] Float'"});
}

TEST_P(DataParallelMismatch, DifferentParameterCountFailsOnEveryRank) {
  expect_mismatch(
      GetParam(), [] { return make_model<MlpImpl>(0); },
      [] { return make_model<MlpImpl>(0, 16, true); },
      {"Rank 0 has 7 parameters, rank 1 has 9", "first difference at parameter #7",
       "rank 0 '(none)'", "rank 1 'extra.weight [4, 4] Float'"});
}

TEST_P(DataParallelMismatch, DifferentDtypeFailsOnEveryRank) {
  expect_mismatch(
      GetParam(), [] { return make_model<MlpImpl>(0); },
      [] {
        auto m = make_model<MlpImpl>(0);
        m->to(torch::kDouble);
        return m;
      },
      {"first difference at parameter #0", "rank 0 'mix [2, 2, 2] Float'",
       "rank 1 'mix [2, 2, 2] Double'"});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DataParallelMismatch, ::testing::Values(2, 3, 4), world_name);

// ---------------------------------------------------------------------------------------------
// 9. Skipped backwards.

class DataParallelSkipped : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_P(DataParallelSkipped, ForwardsWithoutBackwardDoNotDisturbTheNextStep) {
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
    DataParallelOptions options = small_buckets();
    options.find_unused_parameters = find_unused;
    DataParallel ddp(model, borrow(comm), options);
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

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, DataParallelSkipped,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
    [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_find_unused" : "_all_used");
    });

TEST_P(DataParallelWorlds, SkippedBackwardWithABranchUnusedOnSomeRanks) {
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
    DataParallelOptions options;
    options.bucket_cap_mb = 1e-6;  // one parameter per bucket
    options.first_bucket_cap_mb = 1e-6;
    options.find_unused_parameters = true;
    DataParallel ddp(model, borrow(comm), options);
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

TEST_P(DataParallelWorlds, CodecSeesEveryBucketEveryStepAndAveragingStillHolds) {
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
      DataParallelOptions options = small_buckets();
      options.codec = codec;
      DataParallel ddp(model, borrow(comm), options);
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
          int64_t offset = 0;
          for (size_t k = 0; k < c.params.size(); ++k) {
            const at::Tensor& p = params.at(c.params[k]);
            ++seen[c.params[k]];
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

TEST_P(DataParallelWorlds, ConstructionMakesEveryParameterEqualFrozenOnesIncluded) {
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
    DataParallel ddp(model, borrow(comm), small_buckets());
    EXPECT_EQ(ddp.reducer().parameter_names().size(), model->parameters().size() - 1);
    EXPECT_TRUE(same_on_all_ranks(comm, state_bytes(*model)))
        << "rank " << comm.rank() << ": replicas differ after construction";
    EXPECT_TRUE(same_on_all_ranks(comm, bytes_of(model->fc1->weight)))
        << "rank " << comm.rank() << ": frozen fc1.weight differs across ranks";
  }, timeout_of(20s));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DataParallelWorlds, ::testing::Values(1, 2, 3, 4),
                         world_name);

// ---------------------------------------------------------------------------------------------
// Construction errors and module holders.

TEST(DataParallel, NullModuleOrCommunicatorIsAConfigError) {
  run_ranks(1, [](Communicator& comm) {
    EXPECT_THROW(DataParallel(std::shared_ptr<MlpImpl>(), borrow(comm)), ConfigError);
    EXPECT_THROW(DataParallel(std::make_shared<MlpImpl>(), std::shared_ptr<Communicator>()),
                 ConfigError);
    DataParallelOptions zero_cap;
    zero_cap.bucket_cap_mb = 0;
    EXPECT_THROW(DataParallel(std::make_shared<MlpImpl>(), borrow(comm), zero_cap), ConfigError);
  });
}

TEST(DataParallel, AcceptsModuleHoldersAndSkipsFrozenParameters) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::Sequential seq(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
  seq[0]->as<torch::nn::Linear>()->weight.set_requires_grad(false);  // frozen
  const auto x = at::randn({5, 3});
  run_ranks(1, [&](Communicator& comm) {
    DataParallel ddp(seq, borrow(comm));
    EXPECT_EQ(ddp.reducer().parameter_names(),
              (std::vector<std::string>{"0.bias", "2.weight", "2.bias"}));
    ddp(x).sum().backward();
    EXPECT_FALSE(seq[0]->as<torch::nn::Linear>()->weight.grad().defined());
    EXPECT_TRUE(seq[0]->as<torch::nn::Linear>()->bias.grad().defined());
  });
}

}  // namespace
}  // namespace tandem
