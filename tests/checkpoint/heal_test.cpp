// CheckpointManager::heal with ranks as threads: a fresh rank takes a live peer's model, optimizer
// state and values over the communicator, bit for bit, and the next step is bitwise the peer's;
// ranks that are not part of it return at once; bad ranks are refused. (Sliced state heals from
// its replica: tests/sharded/sharded_heal_test.cpp.)
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace tandem {
namespace {

using testing::run_ranks;
using namespace tandem::ckpt_test;

// One SGD step on data that depends only on `step` (ranks are threads: no shared generator).
void sgd_step(Net& net, torch::optim::SGD& opt, int64_t step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + static_cast<uint64_t>(step));
  const at::Tensor x = at::randn({16, 8}, gen), y = at::randn({16, 4}, gen);
  opt.zero_grad();
  (net.forward(x) - y).pow(2).mean().backward();
  opt.step();
}

TEST(CheckpointHeal, AFreshRankTakesTheSourcesStateAndTheNextStepIsBitwise) {
  TempDir dir("heal");
  std::vector<std::map<std::string, at::Tensor>> healed(3), healed_opt(3), next(3);
  run_ranks(3, [&](Communicator& comm) {
    const int rank = comm.rank();
    auto net = std::make_shared<Net>();
    net->eval();  // no dropout: the default generator is shared by the threads
    {
      at::Generator init = at::make_generator<at::CPUGeneratorImpl>(rank == 2 ? 99 : 7);
      at::NoGradGuard no_grad;
      for (auto& p : net->named_parameters()) p.value().copy_(at::randn(p.value().sizes(), init));
    }
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    if (rank != 2) {
      for (int64_t s = 0; s < 3; ++s) sgd_step(*net, opt, s);
    }
    CheckpointManager m(options(dir.path, false, 0, shared_comm(comm)));
    m.add_module("model", net);
    m.add_optimizer("optim", opt);
    int64_t position = rank == 2 ? 0 : 3;
    m.add_values("loader", [&] { return std::map<std::string, CheckpointValue>{{"position", position}}; },
                 [&](const std::map<std::string, CheckpointValue>& v) {
                   position = std::get<int64_t>(v.at("position"));
                 });
    m.set_value("epoch", int64_t{rank == 2 ? 0 : 5});
    m.heal(0, {2});
    EXPECT_EQ(position, 3) << "rank " << rank;
    EXPECT_EQ(std::get<int64_t>(*m.value("epoch")), 5) << "rank " << rank;
    healed[rank] = snapshot(net->named_parameters(), net->named_buffers());
    healed_opt[rank] = optimizer_snapshot({&opt});
    sgd_step(*net, opt, 3);
    next[rank] = snapshot(net->named_parameters(), net->named_buffers());
  });
  expect_bitwise(healed[0], healed[2], "healed model");
  expect_bitwise(healed_opt[0], healed_opt[2], "healed momentum");
  EXPECT_FALSE(healed_opt[2].empty());
  expect_bitwise(next[0], next[2], "the step after the heal");
  expect_bitwise(next[0], next[1], "the rank that took no part");
}

TEST(CheckpointHeal, BadRanksAreRefusedOnEveryRank) {
  TempDir dir("heal_refused");
  run_ranks(3, [&](Communicator& comm) {
    CheckpointManager m(options(dir.path, false, 0, shared_comm(comm)));
    m.set_value("epoch", int64_t{1});
    EXPECT_THROW(m.heal(0, {0}), CheckpointError);            // the source is a receiver
    EXPECT_THROW(m.heal(3, {1}), CheckpointError);            // no such rank
    EXPECT_THROW(m.heal(0, {1, 1}), CheckpointError);         // a receiver twice
    EXPECT_THROW(m.heal({0, 1}, {2}), CheckpointError);       // one source per receiver
    EXPECT_THROW(m.heal({0, 2}, {1, 2}), CheckpointError);    // a source that receives
  });
}

}  // namespace
}  // namespace tandem
