// The training worker of the multi-node fault tests (tests/fault/multinode_fault_test.cpp),
// started by tandemrun agents as "nodes" on loopback. Its math does not depend on the world size,
// so a job whose membership changes (a node lost, a node admitted at a restart) ends with the
// same parameters, bit for bit, as one uninterrupted node:
//   - every step uses a fixed global batch of kBatch samples with global ids; sample i of step s
//     comes from a generator seeded by (s, i) alone;
//   - rank r computes the gradients of its contiguous share, one sample at a time (a sample's
//     gradient is the same bits on any rank), all-gathers them, and every rank sums all kBatch
//     gradients in sample-id order (the same additions in the same order for any world size);
//   - model and optimizer state are replicated and checkpointed by rank 0 (CheckpointManager),
//     so a resume at another world size restores them exactly.
//
//   elastic_worker --ckpt DIR --out FILE [--steps N] [--every K]
//     rank 0 writes the final parameters' raw bytes to FILE.
// Environment: STEP_SLEEP_MS=m sleeps m ms after each step (lets a test act mid-run).
// FAULT_RANK=r FAULT_STEP=s FAULT_KIND=raise makes rank r throw at the start of step s, on
// restart 0 only (always-raise: on every restart); with FAULT_WAIT_FILE=F it first waits (up to
// 30 s) until F exists. Prints "pid P rank R restart C", "restart C resumed at step S world W",
// "step S done" and "done N steps" (flushed), for the tests to follow.
#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/init.h>
#include <tandem/runtime/run_main.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/fault/training_args.h"

namespace {

constexpr int64_t kBatch = 8;  // samples per step, split over the ranks

tandem::testing::TrainingArgs parse(int argc, char** argv) {
  tandem::testing::TrainingArgs a;
  CLI::App app("elastic_worker: the training worker of the multi-node fault tests");
  tandem::testing::add_training_args(app, a);
  app.parse(argc, argv);
  return a;
}

std::string env_or(const char* key, const char* fallback) {
  const char* v = std::getenv(key);
  return v != nullptr ? v : fallback;
}

void maybe_fault(int rank, int64_t step) {
  const std::string kind = env_or("FAULT_KIND", "");
  if (kind.empty() || std::stoi(env_or("FAULT_RANK", "-1")) != rank ||
      std::stoll(env_or("FAULT_STEP", "-1")) != step)
    return;
  if (kind != "always-raise" && env_or("TORCHELASTIC_RESTART_COUNT", "0") != "0") return;
  const std::string wait_file = env_or("FAULT_WAIT_FILE", "");
  if (!wait_file.empty()) {
    struct stat st {};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (::stat(wait_file.c_str(), &st) != 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("fault %s at step %lld\n", kind.c_str(), static_cast<long long>(step));
  std::fflush(stdout);
  throw std::runtime_error("injected failure at step " + std::to_string(step));
}

std::pair<at::Tensor, at::Tensor> sample(int64_t step, int64_t id) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step * kBatch + id));
  return {at::randn({1, 10}, gen), at::randn({1, 3}, gen)};
}

at::Tensor flat_grads(torch::nn::Module& model) {
  std::vector<at::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.grad().reshape({-1}));
  return at::cat(parts);
}

int train(int argc, char** argv) {
  const auto args = parse(argc, argv);
  at::set_num_threads(1);  // the same kernels (and bits) whatever the machine
  auto dist = tandem::init();
  const int rank = dist.world->rank();
  const int world = dist.world->size();
  const std::string restart = env_or("TORCHELASTIC_RESTART_COUNT", "?");
  std::printf("pid %d rank %d restart %s\n", static_cast<int>(::getpid()), rank, restart.c_str());
  std::fflush(stdout);

  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(10, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 3));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();

  tandem::CheckpointManagerOptions ckpt_options;
  ckpt_options.directory = args.ckpt;
  ckpt_options.every_n_steps = args.every;
  ckpt_options.keep_last = 3;
  ckpt_options.async = false;
  ckpt_options.communicator = dist.world;
  tandem::CheckpointManager ckpt(ckpt_options);
  ckpt.add_module("model", *model);  // replicated: written by rank 0, loadable at any world size
  ckpt.add_optimizer("optim", opt);

  const int64_t start = ckpt.resume();
  std::printf("restart %s resumed at step %lld world %d\n", restart.c_str(),
              static_cast<long long>(start), world);
  std::fflush(stdout);
  const int64_t share = (kBatch + world - 1) / world;  // rows per rank; the last may pad
  const long sleep_ms = std::stol(env_or("STEP_SLEEP_MS", "0"));
  for (int64_t step = start; step < args.steps; ++step) {
    maybe_fault(rank, step);
    at::Tensor local = at::zeros({share, numel});
    for (int64_t j = 0; j < share; ++j) {
      const int64_t id = rank * share + j;
      if (id >= kBatch) break;
      auto [x, y] = sample(step, id);
      model->zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      local[j].copy_(flat_grads(*model));
    }
    at::Tensor all = at::empty({world * share, numel});
    dist.world->allgather(all, local)->wait();
    at::Tensor sum = at::zeros({numel});
    for (int64_t id = 0; id < kBatch; ++id) sum.add_(all[id]);  // sample-id order
    sum.div_(static_cast<double>(kBatch));
    int64_t offset = 0;
    for (auto& p : model->parameters()) {
      p.mutable_grad() = sum.slice(0, offset, offset + p.numel()).reshape(p.sizes()).clone();
      offset += p.numel();
    }
    opt.step();
    tandem::heartbeat();
    ckpt.maybe_save(step + 1);
    std::printf("step %lld done\n", static_cast<long long>(step));
    std::fflush(stdout);
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  ckpt.wait();

  if (rank == 0) {
    std::ofstream out(args.out, std::ios::binary | std::ios::trunc);
    for (const auto& p : model->parameters()) {
      const auto c = p.detach().contiguous();
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    }
    if (!out) throw std::runtime_error("cannot write " + args.out);
  }
  std::printf("done %lld steps\n", static_cast<long long>(args.steps));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return tandem::run_main(argc, argv, train); }
