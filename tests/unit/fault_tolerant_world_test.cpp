// FaultTolerantWorld (include/tandem/runtime/fault_tolerance.h) with ranks as threads over one
// HashStore, the test playing the launcher's part (dead/<rank>.<incarnation> and dead/count, and
// starting a replacement). The process tests through tandemrun --ft are tests/fault/ft_*test.cpp.
#include <tandem/base/errors.h>
#include <tandem/runtime/fault_tolerance.h>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ops/ones.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/support/stream_communicator.h"
#include "tests/support/test_support.h"

namespace tandem {
namespace {

constexpr const char* kLauncherKeys = "launcher/ft";

Distributed connect(int rank, int world, const c10::intrusive_ptr<c10d::Store>& store,
                    InitOptions& comm, bool launcher_support = true) {
  Distributed d;
  d.env.rank = rank;
  d.env.world_size = world;
  if (launcher_support) d.env.ft_keys = kLauncherKeys;
  d.store = store;
  comm.env = d.env;
  comm.backend = "gloo";
  comm.store_prefix = "test";
  comm.timeout = std::chrono::seconds(20);
  d.world = connect_world(store, rank, world, comm, comm.store_prefix);
  return d;
}

FaultToleranceOptions enabled() {
  FaultToleranceOptions o;
  o.enabled = true;
  o.quorum_timeout_s = 10;
  return o;
}

TEST(FaultTolerantWorld, BadOptionsNameTheKey) {
  testing::run_threads(1, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 1, store, comm);
    FaultToleranceOptions o = enabled();
    o.min_replicas = 0;
    try {
      FaultTolerantWorld ft(d, comm, o);
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--set ft.min_replicas=1"), std::string::npos) << e.what();
    }
  });
}

// Without the launcher's support (torchrun) a failure propagates, as before.
TEST(FaultTolerantWorld, InactiveWithoutTheLauncherTheFailurePropagates) {
  testing::run_threads(2, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 2, store, comm, /*launcher_support=*/false);
    FaultTolerantWorld ft(d, comm, enabled());
    EXPECT_FALSE(ft.active());
    EXPECT_THROW(ft.step(0, [] { throw CommError("injected"); }), CommError);
  });
}

// One rank's collective fails (it never joins the all-reduce): every rank aborts the step, all
// three (none died) form epoch 1, and the step redone there commits with the full sum.
TEST(FaultTolerantWorld, OneRanksFailedCollectiveAbortsTheStepEverywhere) {
  testing::run_threads(3, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 3, store, comm);
    FaultTolerantWorld ft(d, comm, enabled());
    ASSERT_TRUE(ft.active());
    at::Tensor t;
    auto work = [&](bool fail) {
      return [&, fail] {
        if (fail) throw CommError("injected: rank 2's collective failed");
        t = at::ones({1000});
        ft.communicator()->allreduce(t)->wait();
      };
    };
    EXPECT_EQ(ft.step(0, work(rank == 2)), StepOutcome::kAborted);
    EXPECT_EQ(ft.epoch(), 1);
    EXPECT_EQ(ft.members(), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(ft.step(0, work(false)), StepOutcome::kCommitted);
    EXPECT_EQ(t[999].item<float>(), 3.0f);
    EXPECT_EQ(ft.aborted_steps(), 1);
  });
}

// Rank 2 joins the next epoch and dies before that world's rendezvous: the others give up on the
// rendezvous after ft.quorum_timeout_s (not comm.timeout_s, a minute here) and form the epoch
// after without it. The new world's ops keep comm.timeout_s.
TEST(FaultTolerantWorld, AMemberDyingInTheRendezvousHoldsTheOthersUpForTheQuorumTimeout) {
  testing::run_threads(3, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 3, store, comm);
    comm.timeout = std::chrono::seconds(60);
    FaultToleranceOptions o = enabled();
    o.quorum_timeout_s = 2;
    FaultTolerantWorld ft(d, comm, o);
    EXPECT_EQ(ft.step(0, [] {}), StepOutcome::kCommitted);
    if (rank == 2) {  // joins epoch 1 as a survivor would, then "dies" without voting
      store->set("test/ft/e1/joined/2.0", "1");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(ft.step(1, [] {}), StepOutcome::kAborted);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(took, 20.0) << "the rendezvous waited for comm.timeout_s";
    EXPECT_EQ(ft.epoch(), 2);
    EXPECT_EQ(ft.members(), (std::vector<int>{0, 1}));
    EXPECT_EQ(ft.communicator()->timeout(), std::chrono::seconds(60));
    EXPECT_EQ(ft.step(1, [] {}), StepOutcome::kCommitted);
  });
}

// Rank 2 stops taking part and the launcher reports it dead while the others wait for its vote:
// they abort, form epoch 1 without it at once (not at the quorum timeout), ranked 0 and 1.
TEST(FaultTolerantWorld, AMemberReportedDeadIsLeftOutAtOnce) {
  testing::run_threads(3, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 3, store, comm);
    FaultTolerantWorld ft(d, comm, enabled());
    if (rank == 2) {  // "dies" after the first step, before voting on the second
      EXPECT_EQ(ft.step(0, [] {}), StepOutcome::kCommitted);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      store->set(std::string(kLauncherKeys) + "/dead/2.0", "killed");
      store->add(std::string(kLauncherKeys) + "/dead/count", 1);
      return;
    }
    EXPECT_EQ(ft.step(0, [] {}), StepOutcome::kCommitted);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(ft.step(1, [] {}), StepOutcome::kAborted);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(ft.members(), (std::vector<int>{0, 1}));
    EXPECT_EQ(ft.world_size(), 2);
    EXPECT_EQ(ft.rank(), rank);
    at::Tensor t = at::ones({8});
    EXPECT_EQ(ft.step(1, [&] { ft.communicator()->allreduce(t)->wait(); }), StepOutcome::kCommitted);
    EXPECT_EQ(t[0].item<float>(), 2.0f);
  });
}

// On a GPU a step's collectives have not happened when their waits return: NCCL's wait only
// orders the caller's stream (tests/support/stream_communicator.h stands in for it: each op runs
// 300 ms after its issue). Rank 1 dies as its all-reduce starts, after a vote cast when the work
// returned would have committed the step everywhere. The vote waits for the step's ops to
// complete instead, so rank 0 sees the failure and drops the step (issue 37).
TEST(FaultTolerantWorld, AStepIsVotedOnOnlyOnceItsCollectivesCompletedOnTheDevice) {
  testing::run_threads(2, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    Distributed d = connect(rank, 2, store, comm);
    testing::StreamOptions o;
    o.host_waits = false;
    o.lag = std::chrono::milliseconds(300);
    const std::shared_ptr<Communicator> real = d.world;
    if (rank == 1) {
      o.on_start = [store, real](const std::string& op) {
        if (op != "allreduce") return;
        store->set(std::string(kLauncherKeys) + "/dead/1.0", "killed");  // the launcher's report
        store->add(std::string(kLauncherKeys) + "/dead/count", 1);
        real->abort("rank 1 died");
        throw CommError("rank 1 died");
      };
    }
    d.world = testing::make_stream_communicator(d.world, o);
    FaultTolerantWorld ft(d, comm, enabled());
    at::Tensor t = at::ones({1000});
    auto work = [&] { ft.communicator()->allreduce(t)->wait(); };
    if (rank == 1) {
      try {
        ft.step(0, work);
      } catch (const std::exception&) {  // it died: whatever it saw does not count
      }
      return;
    }
    EXPECT_EQ(ft.step(0, work), StepOutcome::kAborted);
    EXPECT_EQ(ft.members(), (std::vector<int>{0}));
  });
}

// Fewer survivors than ft.min_replicas: a CommError that names the key.
TEST(FaultTolerantWorld, BelowMinReplicasFails) {
  testing::run_threads(2, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 2, store, comm);
    FaultToleranceOptions o = enabled();
    o.min_replicas = 2;
    FaultTolerantWorld ft(d, comm, o);
    if (rank == 1) {
      store->set(std::string(kLauncherKeys) + "/dead/1.0", "killed");
      store->add(std::string(kLauncherKeys) + "/dead/count", 1);
      return;
    }
    try {
      ft.step(0, [] { throw CommError("injected: the peer is gone"); });
      FAIL() << "no error";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("fewer than ft.min_replicas = 2"), std::string::npos)
          << e.what();
    }
  });
}

// Sharded state over groups of 2 of 4 ranks: when rank 3 is lost and nobody takes its place, the
// survivors' shards no longer line up. heal_sources() fails the group (the launcher restarts it
// from its checkpoint), and begin_step() lets that through instead of re-forming around it.
TEST(FaultTolerantWorld, ShardsThatLostTheirPlaceFailTheGroup) {
  testing::run_threads(4, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    InitOptions comm;
    const Distributed d = connect(rank, 4, store, comm);
    FaultTolerantWorld ft(d, comm, enabled());
    int64_t step = 0;
    EXPECT_FALSE(ft.begin_step(step, [&] { ft.heal_sources(2); }));  // nothing changed
    EXPECT_EQ(ft.step(0, [] {}), StepOutcome::kCommitted);
    if (rank == 3) {
      store->set(std::string(kLauncherKeys) + "/dead/3.0", "killed");
      store->add(std::string(kLauncherKeys) + "/dead/count", 1);
      return;
    }
    EXPECT_EQ(ft.step(1, [] {}), StepOutcome::kAborted);
    EXPECT_EQ(ft.members(), (std::vector<int>{0, 1, 2}));
    step = 1;
    try {
      ft.begin_step(step, [&] { ft.heal_sources(2); });
      FAIL() << "no error";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot go on with the 3 members"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(store->check({std::string(kLauncherKeys) + "/group_failed"}));
    EXPECT_EQ(ft.epoch(), 1);  // not re-formed again
  });
}

// Ranks 0-2 train; rank 2 dies after step 0 and thread 3 plays its replacement (incarnation 1),
// started once the launcher reported the death. `wait_s` is ft.replacement_wait_s: with it the
// survivors wait for the replacement while re-forming after the aborted step 1; without, they go
// on as two and admit it at the start of a later step. Either way every member agrees on who
// heals whom, and the world is whole again.
void replace_rank_2(double wait_s) {
  testing::run_threads(4, [wait_s](int thread, c10::intrusive_ptr<c10d::Store> store) {
    FaultToleranceOptions o = enabled();
    o.replacement_wait_s = wait_s;
    InitOptions comm;
    const std::string dead = std::string(kLauncherKeys) + "/dead/2.0";
    at::Tensor t = at::ones({16});
    // With a wait it asks to join once rank 2 is reported dead; without, once the survivors
    // committed a step as two.
    const std::string start_key = wait_s > 0 ? dead : "test/shrunk";
    if (thread == 3) {  // the replacement: no world of its own until admitted
      while (!store->check({start_key})) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      Distributed d;
      d.env.rank = 2;
      d.env.world_size = 3;
      d.env.ft_keys = kLauncherKeys;
      d.env.ft_join = 1;
      d.store = store;
      comm.env = d.env;
      comm.backend = "gloo";
      comm.store_prefix = "test";
      comm.timeout = std::chrono::seconds(20);
      FaultTolerantWorld ft(d, comm, o);
      EXPECT_TRUE(ft.replacement());
      int64_t step = -1;
      EXPECT_TRUE(ft.begin_step(step, [&] {
        EXPECT_EQ(ft.heal_receivers(), std::vector<int>{2});
        EXPECT_EQ(ft.heal_source(), 0);
        EXPECT_EQ(ft.heal_sources(1), std::vector<int>{0});  // replicated state: any holder
      }));
      EXPECT_GE(step, 1);
      EXPECT_EQ(ft.rank(), 2);
      EXPECT_EQ(ft.step(step, [&] { ft.communicator()->allreduce(t)->wait(); }), StepOutcome::kCommitted);
      EXPECT_EQ(t[0].item<float>(), 3.0f);
      return;
    }
    const Distributed d = connect(thread, 3, store, comm);
    FaultTolerantWorld ft(d, comm, o);
    auto allreduce = [&] {
      t = at::ones({16});
      ft.communicator()->allreduce(t)->wait();
    };
    EXPECT_EQ(ft.step(0, allreduce), StepOutcome::kCommitted);
    if (thread == 2) {  // dies before voting on step 1
      store->set(dead, "killed");
      store->add(std::string(kLauncherKeys) + "/dead/count", 1);
      return;
    }
    EXPECT_EQ(ft.step(1, allreduce), StepOutcome::kAborted);
    std::vector<int> receivers, sources;
    int source = -1;
    auto rebuild = [&] {
      receivers = ft.heal_receivers();
      source = ft.heal_source();
      sources = ft.heal_sources(1);
    };
    int64_t step = 1;
    for (;; ++step) {
      ft.begin_step(step, rebuild);
      if (ft.world_size() == 3 || step == 400) break;
      EXPECT_EQ(ft.step(step, allreduce), StepOutcome::kCommitted);
      if (thread == 0) store->set("test/shrunk", "1");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(ft.world_size(), 3);
    if (wait_s > 0) {
      EXPECT_EQ(step, 1);  // the redone step already has the replacement
    } else {
      EXPECT_GT(step, 1);  // steps at the smaller size came first
    }
    EXPECT_EQ(receivers, std::vector<int>{2});
    EXPECT_EQ(source, 0);
    EXPECT_EQ(sources, std::vector<int>{0});
    EXPECT_EQ(ft.members(), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(ft.step(step, allreduce), StepOutcome::kCommitted);
    EXPECT_EQ(t[0].item<float>(), 3.0f);
  });
}

TEST(FaultTolerantWorld, SurvivorsWaitForAReplacementAndHealIt) { replace_rank_2(10.0); }

TEST(FaultTolerantWorld, ALateReplacementIsAdmittedAtAStepStart) { replace_rank_2(0.0); }

}  // namespace
}  // namespace tandem
