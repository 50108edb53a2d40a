// CheckpointManager with ranks as threads: every rank writes its shard and gets its own state back
// (2 and 4 ranks), replicated state is written once and loads at another world size, sharded state
// at another world size is an error unless only replicated state is restored, ranks agree on the
// newest step valid everywhere, and nothing is committed unless every rank wrote its shard.
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>

#include "checkpoint/step_directory.h"
#include "tests/support/fault_injection_file_system.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <mutex>

namespace tandem {
namespace {

using testing::run_ranks;
using namespace tandem::ckpt_test;

struct RankState {
  std::shared_ptr<Net> net;
  FakeCodec codec;
  std::map<std::string, CheckpointValue> loader;
  at::Generator gen;
};

void setup_rank(RankState& s, int rank, uint64_t seed) {
  s.gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(rank));
  s.net = std::make_shared<Net>();
  // Replicated model: the same values on every rank, from a private generator (ranks are threads
  // sharing the global one).
  at::Generator init = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : s.net->named_parameters()) p.value().copy_(at::randn(p.value().sizes(), init));
  for (int i = 0; i <= rank; ++i) s.codec.step();
  s.loader = {{"position", int64_t{1000 + rank}}, {"rank", static_cast<int64_t>(rank)}};
}

void register_rank(CheckpointManager& m, RankState& s) {
  m.add_module("model", s.net);
  m.add_rng("rng", s.gen);
  m.add_tensors(
      "codec", [&s] { return s.codec.state(); },
      [&s](const std::map<std::string, at::Tensor>& t) { s.codec.load_state(t); },
      Sharding::kSharded);
  m.add_values("loader", [&s] { return s.loader; },
               [&s](const std::map<std::string, CheckpointValue>& v) { s.loader = v; }, Sharding::kSharded);
}

class Sharded : public ::testing::TestWithParam<int> {};

TEST_P(Sharded, EveryRankWritesItsShardAndGetsItsOwnStateBack) {
  const int world = GetParam();
  TempDir dir("sharded" + std::to_string(world));
  for (const bool async : {false, true}) {
    const std::string d = dir.path + (async ? "/async" : "/sync");
    run_ranks(world, [&](Communicator& comm) {
      const int rank = comm.rank();
      RankState s;
      setup_rank(s, rank, 11);
      const auto model = snapshot(s.net->named_parameters(), s.net->named_buffers());
      const auto codec = s.codec.state();
      const at::Tensor rng = s.gen.get_state();
      {
        CheckpointManager m(options(d, async, 0, shared_comm(comm)));
        register_rank(m, s);
        m.save(5);
        m.wait();
      }
      // Scramble, then resume on fresh managers.
      RankState t;
      setup_rank(t, rank, 99);
      t.codec.step();
      t.loader.clear();
      CheckpointManager r(options(d, async, 0, shared_comm(comm)));
      register_rank(r, t);
      EXPECT_EQ(r.resume(), 5);
      expect_bitwise(model, snapshot(t.net->named_parameters(), t.net->named_buffers()), "model");
      expect_bitwise(codec, t.codec.state(), "codec rank " + std::to_string(rank));
      EXPECT_TRUE(at::equal(rng, t.gen.get_state())) << rank;
      EXPECT_EQ(std::get<int64_t>(t.loader.at("position")), 1000 + rank);
    });
    // One file per rank; the replicated model only in rank 0's.
    const Manifest man = detail::read_manifest(*posix_file_system(), d, 5);
    ASSERT_EQ(static_cast<int>(man.files.size()), world);
    for (const auto& f : man.files) {
      bool has_model = false;
      for (const auto& t : f.tensors) has_model = has_model || t.name.rfind("model/", 0) == 0;
      EXPECT_EQ(has_model, f.rank == 0) << f.name;
      EXPECT_NO_THROW(verify_committed(d, 5));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Sharded, ::testing::Values(2, 4));

TEST(CheckpointManagerRanks, ReplicatedStateWrittenOnceAndLoadsAtAnotherWorldSize) {
  TempDir dir("reshard");
  at::manual_seed(21);
  auto reference = std::make_shared<Net>();
  const auto model = snapshot(reference->named_parameters(), reference->named_buffers());
  run_ranks(4, [&](Communicator& comm) {
    auto net = std::make_shared<Net>();
    {
      at::NoGradGuard g;
      auto params = net->named_parameters();
      for (auto& p : params) p.value().copy_(model.at(p.key()));
    }
    CheckpointManager m(options(dir.path, true, 0, shared_comm(comm)));
    m.add_module("model", net);
    m.set_value("step", int64_t{8});
    m.save(8);
    m.wait();
  });
  const Manifest man = detail::read_manifest(*posix_file_system(), dir.path, 8);
  EXPECT_EQ(man.world_size, 4);
  ASSERT_EQ(man.files.size(), 1u);  // only rank 0 holds unique state
  for (const int world : {2, 1}) {
    run_ranks(world, [&](Communicator& comm) {
      auto net = std::make_shared<Net>();
      CheckpointManager r(options(dir.path, true, 0, shared_comm(comm)));
      r.add_module("model", net);
      EXPECT_EQ(r.resume(), 8);
      expect_bitwise(model, snapshot(net->named_parameters(), net->named_buffers()), "model");
    });
  }
}

TEST(CheckpointManagerRanks, ShardedStateAtAnotherWorldSizeIsAnErrorUnlessReplicatedOnly) {
  TempDir dir("reshard_sharded");
  run_ranks(2, [&](Communicator& comm) {
    RankState s;
    setup_rank(s, comm.rank(), 3);
    CheckpointManager m(options(dir.path, false, 0, shared_comm(comm)));
    register_rank(m, s);
    m.save(4);
  });
  RankState s;
  setup_rank(s, 0, 50);
  {
    CheckpointManager r(options(dir.path, false));
    register_rank(r, s);
    try {
      r.resume();
      ADD_FAILURE() << "sharded state loaded at another world size";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("saved by 2 ranks"), std::string::npos) << e.what();
    }
  }
  CheckpointManagerOptions o = options(dir.path, false);
  o.reshard = ReshardPolicy::kLoadReplicatedOnly;
  o.on_warning = [](const std::string&) {};
  const at::Tensor rng = s.gen.get_state();
  CheckpointManager r(o);
  register_rank(r, s);
  EXPECT_EQ(r.resume(), 4);
  EXPECT_TRUE(at::equal(rng, s.gen.get_state()));  // sharded state untouched
}

TEST(CheckpointManagerRanks, RanksAgreeOnTheNewestStepValidEverywhere) {
  TempDir dir("agree");
  run_ranks(2, [&](Communicator& comm) {
    RankState s;
    setup_rank(s, comm.rank(), 1);
    CheckpointManager m(options(dir.path, false, 0, shared_comm(comm)));
    register_rank(m, s);
    m.save(10);
    s.codec.step();
    m.save(20);
  });
  // Only rank 1's shard of step 20 is damaged: rank 0 alone would take step 20.
  flip_bit(detail::step_directory(dir.path, 20) + "/" + shard_file_name(1), -3);
  run_ranks(2, [&](Communicator& comm) {
    RankState s;
    setup_rank(s, comm.rank(), 2);
    CheckpointManagerOptions o = options(dir.path, false, 0, shared_comm(comm));
    o.on_warning = [](const std::string&) {};
    CheckpointManager r(o);
    register_rank(r, s);
    EXPECT_EQ(r.resume(), 10) << "rank " << comm.rank();
  });
}

TEST(CheckpointManagerRanks, NoCommitUnlessEveryRankWroteItsShard) {
  TempDir dir("two_phase");
  run_ranks(2, [&](Communicator& comm) {
    auto fs = std::make_shared<FaultInjectionFileSystem>();
    RankState s;
    setup_rank(s, comm.rank(), 1);
    CheckpointManagerOptions o = options(dir.path, true, 0, shared_comm(comm));
    o.file_system = fs;
    CheckpointManager m(o);
    register_rank(m, s);
    m.save(10);
    m.wait();
    if (comm.rank() == 1) fs->fail_all(FaultInjectionFileSystem::Op::kAppend, ENOSPC);
    m.save(20);
    try {
      m.wait();
      ADD_FAILURE() << "rank " << comm.rank() << ": the failed save was not reported";
    } catch (const CheckpointError& e) {
      const std::string want = comm.rank() == 1 ? "No space left" : "rank(s) 1 failed";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_EQ(m.committed_steps(), (std::vector<int64_t>{10}));
    fs->reset();
    m.save(30);  // and the next one works
    m.wait();
    EXPECT_EQ(m.committed_steps().front(), 30);
  });
}

}  // namespace
}  // namespace tandem
