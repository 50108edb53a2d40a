// Activation checkpointing inside DistributedDataParallel, 2 ranks as threads over one HashStore:
// training with checkpointed layers gives bitwise the same parameters as without, for
// CheckpointedSequential policies (including every parameter inside a checkpoint) and for
// tandem::checkpoint calls inside a custom module, with and without find_unused_parameters.
// DistributedDataParallel itself throws if a parameter's gradient-ready hook fires twice in one
// backward, so passing also shows the hooks fire once per parameter per step.
//
// Models and data are made on the test's main thread (torch::manual_seed is process-global);
// the models have no dropout, because rank threads share the default CPU generator.
#include "tests/support/test_support.h"

#include <tandem/runtime/activation_checkpoint.h>
#include <tandem/runtime/distributed_data_parallel.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem {
namespace {

using namespace std::chrono_literals;
constexpr int kWorld = 2;
constexpr int kSteps = 4;

torch::nn::Sequential make_sequential() {
  torch::manual_seed(31);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 4));
}

// Two layers, the first (optionally) inside tandem::checkpoint with its parameters discovered.
struct TwoLayerImpl : torch::nn::Module {
  explicit TwoLayerImpl(bool ckpt) : ckpt_(ckpt) {
    torch::manual_seed(32);
    a = register_module("a", torch::nn::Linear(8, 16));
    b = register_module("b", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto body = [this](const at::Tensor& h) { return torch::tanh(a(h)); };
    auto h = ckpt_ ? activation_checkpoint(body, x) : body(x);
    return b(h);
  }
  bool ckpt_;
  torch::nn::Linear a{nullptr}, b{nullptr};
};

struct Batch {
  at::Tensor x, y;
};

Batch batch_of(int rank, int step) {
  auto gen = at::detail::createCPUGenerator(500 + 31 * rank + step);
  return {at::randn({6, 8}, gen), at::randn({6, 4}, gen)};
}

std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

at::Tensor state_bytes(torch::nn::Module& m) {
  std::vector<at::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().contiguous().view({-1}).view(at::kByte));
  return at::cat(parts);
}

// Trains `models[rank]` under DistributedDataParallel on 2 rank threads for kSteps SGD steps;
// returns the parameter bytes of each rank after each step: [rank][step].
template <class Holder>
std::vector<std::vector<at::Tensor>> train(const std::vector<Holder>& models, bool find_unused) {
  std::vector<std::vector<at::Tensor>> states(kWorld);
  GlooOptions gloo;
  gloo.timeout = 20s;
  testing::run_ranks(kWorld, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto model = models[rank];
    DistributedDataParallelOptions options;
    options.find_unused_parameters = find_unused;
    options.bucket_cap_mb = 0.001;  // several buckets
    options.first_bucket_cap_mb = 0.0002;
    DistributedDataParallel ddp(model, borrow(comm), options);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch_of(rank, step);
      torch::mse_loss(ddp(b.x), b.y).backward();
      opt.step();
      opt.zero_grad();
      states[rank].push_back(state_bytes(*model));
    }
  }, gloo);
  return states;
}

void expect_same(const std::vector<std::vector<at::Tensor>>& got,
                 const std::vector<std::vector<at::Tensor>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << what;
    for (size_t s = 0; s < got[r].size(); ++s) {
      EXPECT_TRUE(at::equal(got[r][s], want[r][s]))
          << what << ": rank " << r << " step " << s << " differs from training without checkpoints";
    }
  }
  // And the replicas agree with each other.
  for (size_t s = 0; s < got[0].size(); ++s) EXPECT_TRUE(at::equal(got[0][s], got[1][s])) << what;
}

TEST(ActivationCheckpointDataParallel, CheckpointedSequentialEqualsPlain) {
  for (bool find_unused : {false, true}) {
    std::vector<torch::nn::Sequential> plain;
    for (int r = 0; r < kWorld; ++r) plain.push_back(make_sequential());
    const auto want = train(plain, find_unused);
    for (const auto& policy :
         {ActivationCheckpointPolicy::every(2).checkpoint_last(true),  // all inside
          ActivationCheckpointPolicy::sqrt(), ActivationCheckpointPolicy::segments(2)}) {
      std::vector<CheckpointedSequential> ckpt;
      for (int r = 0; r < kWorld; ++r) ckpt.emplace_back(make_sequential(), policy);
      const std::string what = ckpt[0]->describe() + (find_unused ? ", find_unused_parameters" : "");
      expect_same(train(ckpt, find_unused), want, what);
    }
  }
}

TEST(ActivationCheckpointDataParallel, CheckpointCallInsideModuleEqualsPlain) {
  for (bool find_unused : {false, true}) {
    std::vector<std::shared_ptr<TwoLayerImpl>> plain, ckpt;
    for (int r = 0; r < kWorld; ++r) {
      plain.push_back(std::make_shared<TwoLayerImpl>(false));
      ckpt.push_back(std::make_shared<TwoLayerImpl>(true));
    }
    expect_same(train(ckpt, find_unused), train(plain, find_unused),
                find_unused ? "activation_checkpoint() in a module, find_unused_parameters"
                            : "activation_checkpoint() in a module");
  }
}

}  // namespace
}  // namespace tandem
