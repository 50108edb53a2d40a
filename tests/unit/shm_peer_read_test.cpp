// The one-copy shared-memory all-gather (collectives/shm/peer_memory.h, shm_collectives.h): the
// probe reads what a process published and refuses what is not there; a read from a process that
// is gone is a PeerLostError, from a bad address a CommError; the channel offers peer reads only
// when every rank wants them; all-gathers at and above the threshold equal the two-copy path
// bitwise for every dtype and world size, also with inputs that alias the output. A peer killed
// or stopped mid-all-gather is in shm_allreduce_process_test.cpp. Where a seccomp filter refuses
// process_vm_readv altogether, the tests that need it skip (the all-gather keeps two copies).
#include "tests/support/test_support.h"
#include "tests/unit/shm_test_util.h"

#include "collectives/shm/peer_memory.h"
#include "collectives/shm/shm_channel.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace tandem {
namespace {

using namespace shm_test;
using detail::PeerReadProbe;
using detail::read_peer_memory;
using testing::run_threads;

// A pid that no process has now: a child that already exited and was reaped.
pid_t reaped_pid() {
  pid_t pid = -1;
  char exe[] = "/bin/true";
  char* argv[] = {exe, nullptr};
  EXPECT_EQ(::posix_spawn(&pid, exe, nullptr, nullptr, argv, environ), 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// process_vm_readv on this very process: refused only where a seccomp filter (or a kernel without
// it) refuses the call itself; the all-gather then keeps two copies, and these tests do not apply.
bool peer_reads_possible() {
  uint64_t word = 7, seen = 0;
  iovec local{&seen, sizeof seen}, remote{&word, sizeof word};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == sizeof seen;
}

#define SKIP_WITHOUT_PEER_READS()                                                          \
  if (!peer_reads_possible()) GTEST_SKIP() << "process_vm_readv is refused here: " \
                                           << std::strerror(errno)

TEST(ShmPeerReads, ProbeReadsThisProcessAndRefusesWhatIsNotThere) {
  SKIP_WITHOUT_PEER_READS();
  const PeerReadProbe probe;
  EXPECT_TRUE(PeerReadProbe::can_read(probe.published())) << probe.published();
  // The same pid and address with another value: what a pid from another namespace looks like.
  std::string other = probe.published();
  other.back() = other.back() == '1' ? '2' : '1';
  EXPECT_FALSE(PeerReadProbe::can_read(other));
  EXPECT_FALSE(PeerReadProbe::can_read(std::to_string(reaped_pid()) + " 4096 1"));
  EXPECT_FALSE(PeerReadProbe::can_read("not a probe"));
}

TEST(ShmPeerReads, AGoneProcessIsPeerLostAndABadAddressIsCommError) {
  SKIP_WITHOUT_PEER_READS();
  uint64_t word = 42, seen = 0;
  read_peer_memory(::getpid(), reinterpret_cast<uintptr_t>(&word), &seen, sizeof seen, "rank 1");
  EXPECT_EQ(seen, 42u);
  try {
    read_peer_memory(reaped_pid(), reinterpret_cast<uintptr_t>(&word), &seen, 8, "rank 1");
    ADD_FAILURE() << "read from a process that is gone";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  // A page that is not mapped: the peer's buffer is gone, not the peer.
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  ::munmap(page, 4096);
  try {
    read_peer_memory(::getpid(), reinterpret_cast<uintptr_t>(page), &seen, 8, "rank 1");
    ADD_FAILURE() << "read from an unmapped page";
  } catch (const PeerLostError& e) {
    ADD_FAILURE() << "an unmapped page is not a lost peer: " << e.what();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("Bad address"), std::string::npos) << e.what();
  }
}

// Ranks as threads of one process may always read each other; one rank that turns peer reads
// off turns them off for every rank.
TEST(ShmPeerReads, TheChannelOffersPeerReadsOnlyWhenEveryRankWantsThem) {
  SKIP_WITHOUT_PEER_READS();
  for (int refusing : {-1, 0, 2}) {
    run_threads(3, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
      detail::ShmChannelOptions o;
      o.slot_bytes = 4096;
      o.timeout = o.rendezvous_timeout = shm_options().timeout;
      o.peer_reads = rank != refusing;
      auto channel = detail::connect_shm_channel(store, "peer-reads", rank, {0, 1, 2}, o);
      ASSERT_NE(channel, nullptr);
      EXPECT_EQ(channel->reads_peers(), refusing < 0)
          << "rank " << rank << ", refusing rank " << refusing;
    });
  }
}

class ShmPeerReadAllgather : public ::testing::TestWithParam<int> {};

// Bytes per rank just below, at and well above the 1 MiB threshold, every dtype: the one-copy
// path and the two-copy path give every rank's input in rank order, bitwise.
TEST_P(ShmPeerReadAllgather, EqualsTheTwoCopyPathBitwise) {
  const int world = GetParam();
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto one = connect_gloo(store, rank, world, shm_options(64 << 10));
    GlooOptions o = shm_options(64 << 10);
    o.shared_memory_peer_reads = false;
    o.store_prefix = "two-copies";
    auto two = connect_gloo(store, rank, world, o);
    for (auto dtype : testing::kAllDtypes) {
      const int64_t es = c10::elementSize(dtype);
      for (int64_t bytes : {(1 << 20) - 64, 1 << 20, 3 << 20}) {
        const int64_t n = bytes / es + 3;  // not a multiple of anything
        const auto piece = input_for(rank, n, dtype, ReduceOp::kSum);
        auto a = at::full({world * n}, 77, dtype);
        auto b = at::full({world * n}, 77, dtype);
        one->allgather(a, piece)->wait();
        two->allgather(b, piece)->wait();
        EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0)
            << c10::toString(dtype) << " n=" << n << " rank " << rank;
        for (int q = 0; q < world; ++q) {
          EXPECT_TRUE(at::equal(a.narrow(0, q * n, n), input_for(q, n, dtype, ReduceOp::kSum)))
              << c10::toString(dtype) << " n=" << n << " slice " << q;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmPeerReadAllgather, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// The input as this rank's own chunk of the output (read in place by the peers), and as chunk 0
// on every rank (overwritten by this rank while the peers still read it: read from a copy).
TEST(ShmPeerReadAllgatherAliasing, InputsInsideTheOutput) {
  const int world = 3;
  const int64_t n = 300000;  // 1.2 MB per rank: the one-copy path
  run_threads(world, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = connect_gloo(store, rank, world, shm_options());
    auto value = [](int r) { return at::arange(n, at::kFloat) * 0.5f + r; };
    const auto want = at::cat({value(0), value(1), value(2)});
    for (int round = 0; round < 20; ++round) {
      auto out = at::zeros({world * n});
      out.narrow(0, rank * n, n).copy_(value(rank));
      comm->allgather(out, out.narrow(0, rank * n, n))->wait();
      EXPECT_TRUE(at::equal(out, want)) << "own chunk, round " << round;

      auto out2 = at::zeros({world * n});
      out2.narrow(0, 0, n).copy_(value(rank));
      comm->allgather(out2, out2.narrow(0, 0, n))->wait();
      EXPECT_TRUE(at::equal(out2, want)) << "chunk 0, round " << round;
    }
  });
}

}  // namespace
}  // namespace tandem
