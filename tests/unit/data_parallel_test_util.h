// Shared by the DistributedDataParallel tests (data_parallel_test.cpp,
// data_parallel_edge_test.cpp): small models with several shapes and dtypes, batches,
// single-process references, byte comparisons across ranks, a recording codec and the world-size
// fixture. Ranks run as threads over one HashStore. Models and data are made on the test's main
// thread (torch::manual_seed is process-global, so seeding from rank threads would race); rank
// threads only run DistributedDataParallel.
#pragma once

#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/distributed_data_parallel.h>

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
// Overlap on: the path that launches buckets while backward runs (auto turns it off on a machine
// with no core to spare, such as the 2-core CI machine running ranks as threads).
DistributedDataParallelOptions small_buckets() {
  DistributedDataParallelOptions options;
  options.bucket_cap_mb = 0.001;
  options.first_bucket_cap_mb = 0.0002;
  options.overlap = DistributedDataParallelOptions::Overlap::kOn;
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

// Gradients of sum_r loss(model, r) / world in one process: what DistributedDataParallel's average
// of the ranks' local gradients must equal.
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

class DistributedDataParallelWorlds : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

}  // namespace
}  // namespace tandem
