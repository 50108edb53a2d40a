// Worker program for the DistributedDataParallel process tests: connects with tandem::init() from
// the environment and runs one scenario.
//   train [steps]  trains a small MLP (torch::nn::Sequential) with SGD + momentum on data seeded by
//                  rank and step; prints "PARAMS <XXH3-64 of the parameters' bytes>" and the
//                  number of steps.
//   check-grads    one step on a global batch split across ranks; compares every gradient with the
//                  single-process full-batch gradient computed in this process (relative error
//                  <= 1e-6, bitwise for a world of one); prints "GRADS OK" or "GRADS MISMATCH".
//   mismatch       rank 1 builds a wider hidden layer; construction must fail on every rank.
// Exit codes: 0 scenario passed, 1 scenario failed, 4 ConfigError, 5 TimeoutError, 6 CommError,
// 7 other tandem::Error, each printed as "tandem error (<Type>): <message>".
#include "tests/multiprocess/worker_main.h"

#include <tandem/tandem.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>

namespace {

constexpr int64_t kGlobalBatch = 24;

torch::nn::Sequential make_mlp(uint64_t seed, int64_t hidden = 32) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(10, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, 3));
}

tandem::DistributedDataParallelOptions small_buckets() {
  tandem::DistributedDataParallelOptions options;
  options.bucket_cap_mb = 0.002;
  options.first_bucket_cap_mb = 0.0005;
  return options;
}

std::pair<at::Tensor, at::Tensor> batch(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto x = at::randn({n, 10}, gen);
  auto y = at::randn({n, 3}, gen);
  return {x, y};
}

uint64_t checksum(const std::vector<at::Tensor>& tensors) {
  tandem::Xxh3Stream hash;
  for (const auto& t : tensors) {
    const auto c = t.detach().contiguous();
    hash.update(c.data_ptr(), c.nbytes());
  }
  return hash.digest();
}

int train(tandem::Communicator& comm, int steps) {
  // Seeded by rank: the construction broadcast must make the replicas equal.
  auto model = make_mlp(1 + comm.rank());
  tandem::DistributedDataParallel ddp(
      model, std::shared_ptr<tandem::Communicator>(&comm, [](auto*) {}), small_buckets());
  std::printf("BUCKETS %zu\n", ddp.reducer().bucket_plan().size());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(8, 1000 + 97 * comm.rank() + step);
    auto loss = torch::mse_loss(ddp(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  std::printf("PARAMS %016" PRIx64 " after %d steps\n", checksum(model->parameters()), steps);
  return 0;
}

int check_grads(tandem::Communicator& comm) {
  const int world = comm.size();
  if (kGlobalBatch % world != 0) {
    std::printf("world size %d does not divide the batch %" PRId64 "\n", world, kGlobalBatch);
    return 1;
  }
  auto [x, y] = batch(kGlobalBatch, 4242);
  auto reference = make_mlp(0);
  torch::mse_loss(reference->forward(x), y).backward();

  auto model = make_mlp(0);
  tandem::DistributedDataParallel ddp(
      model, std::shared_ptr<tandem::Communicator>(&comm, [](auto*) {}), small_buckets());
  const int64_t n = kGlobalBatch / world;
  torch::mse_loss(ddp(x.narrow(0, comm.rank() * n, n)), y.narrow(0, comm.rank() * n, n))
      .backward();
  const auto got = model->named_parameters();
  const auto want = reference->parameters();
  double worst = 0;
  bool exact = true;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& g = got[i].value().grad();
    const auto& w = want[i].grad();
    if (!g.defined()) {
      std::printf("GRADS MISMATCH: %s has no gradient\n", got[i].key().c_str());
      return 1;
    }
    exact = exact && at::equal(g, w);
    const double rel = ((g.to(at::kDouble) - w.to(at::kDouble)).norm() / w.to(at::kDouble).norm())
                           .item<double>();
    worst = std::max(worst, rel);
  }
  const bool ok = world == 1 ? exact : worst <= 1e-6;
  std::printf("GRADS %s rel_error=%.3g exact=%d rank %d of %d\n", ok ? "OK" : "MISMATCH", worst,
              exact ? 1 : 0, comm.rank(), world);
  return ok ? 0 : 1;
}

int mismatch(tandem::Communicator& comm) {
  auto model = make_mlp(0, comm.rank() == 1 ? 33 : 32);
  tandem::DistributedDataParallel ddp(model,
                                      std::shared_ptr<tandem::Communicator>(&comm, [](auto*) {}));
  std::printf("no error although rank 1 holds a different model\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("dp_worker: a DistributedDataParallel test worker");
  app.require_subcommand(0, 1);  // none: train 20 steps
  int steps = 20;
  auto* train_cmd = app.add_subcommand("train", "train and compare with a local model");
  train_cmd->add_option("steps", steps, "training steps")->capture_default_str();
  auto* grads = app.add_subcommand("check-grads", "gradients equal the full-batch ones");
  auto* mismatch_cmd = app.add_subcommand("mismatch", "ranks with different models are refused");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  return tandem::testing::run_worker([&](tandem::Distributed& dist) {
    if (*grads) return check_grads(*dist.world);
    if (*mismatch_cmd) return mismatch(*dist.world);
    (void)train_cmd;
    return train(*dist.world, steps);
  });
}
