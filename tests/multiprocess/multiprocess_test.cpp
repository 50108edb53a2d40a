// Collectives across real processes: a 4-rank run through tandemrun, and the failure cases with
// workers started directly (tandemrun would stop the survivors, hiding the error they raise).
#include "tests/launcher/tandemrun_process.h"
#include "tests/multiprocess/process_env.h"

#include <gtest/gtest.h>


#include <memory>
#include <string>
#include <vector>

namespace tandem {
namespace {

using launcher_test::clean_env;
using launcher_test::RunResult;
using launcher_test::TandemrunProcess;
using launcher_test::worker_path;
using testing::contains;
using testing::free_port;
using testing::rank_env;
using namespace std::chrono_literals;

std::unique_ptr<TandemrunProcess> start_worker(const std::vector<std::string>& env,
                                               const std::string& mode) {
  return std::make_unique<TandemrunProcess>(std::vector<std::string>{worker_path(), mode}, env,
                                            /*through_tandemrun=*/false);
}

TEST(Multiprocess, FourRanksThroughTandemrunVerifyEveryCollective) {
  const RunResult r = launcher_test::run_tandemrun(
      {"--standalone", "--nproc-per-node", "4", worker_path(), "verify"}, clean_env(), 50s);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(contains(r.out, "[rank " + std::to_string(rank) + "]: OK rank " +
                                    std::to_string(rank) + " of 4"))
        << r.out;
  }
}

TEST(Multiprocess, KilledPeerRaisesCommErrorWithinTheTimeout) {
  const int port = free_port();
  auto rank0 = start_worker(rank_env(0, 2, port, "10"), "peer-dies");
  auto rank1 = start_worker(rank_env(1, 2, port, "10"), "peer-dies");
  const RunResult r0 = rank0->finish(40s);
  const RunResult r1 = rank1->finish(10s);
  EXPECT_EQ(r1.term_signal, SIGKILL);
  ASSERT_TRUE(r0.exited) << r0.out << r0.err;
  EXPECT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  EXPECT_TRUE(contains(r0.out, "CAUGHT")) << r0.out;
  EXPECT_TRUE(contains(r0.out, "allreduce #1 (sum, 1.00 MiB float32) on ranks [0, 1]")) << r0.out;
  EXPECT_LT(r0.seconds, 30.0);
}

TEST(Multiprocess, HungPeerRaisesTimeoutErrorWithinTheTimeout) {
  const int port = free_port();
  auto rank0 = start_worker(rank_env(0, 2, port, "2"), "peer-hangs");
  auto rank1 = start_worker(rank_env(1, 2, port, "2"), "peer-hangs");
  const RunResult r0 = rank0->finish(40s);
  rank1->send(SIGKILL);  // it stopped itself; its death is not under test
  rank1->finish(10s);
  ASSERT_TRUE(r0.exited) << r0.out << r0.err;
  EXPECT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  EXPECT_TRUE(contains(r0.out, "CAUGHT TimeoutError")) << r0.out;
  EXPECT_TRUE(contains(r0.out, "allreduce #1")) << r0.out;
  EXPECT_LT(r0.seconds, 30.0);
}

TEST(Multiprocess, MissingPeerFailsRendezvousNamingIt) {
  const RunResult r =
      start_worker(rank_env(0, 3, free_port(), "2"), "init-only")->finish(40s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "tandem error (TimeoutError)")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1, rank 2 never arrived")) << r.out;
}

TEST(Multiprocess, UnreachableStoreFailsWithinTheTimeout) {
  const RunResult r =
      start_worker(rank_env(1, 2, free_port(), "2"), "init-only")->finish(40s);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "could not reach the rendezvous store at 127.0.0.1:")) << r.out;
}

TEST(Multiprocess, BadEnvironmentFailsBeforeAnyConnection) {
  struct Case {
    std::vector<std::string> env;
    std::string message;
  };
  const int port = free_port();
  std::vector<Case> cases = {
      {{"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)},
       "RANK=2 must be in [0, WORLD_SIZE=2)"},
      {{"RANK=0", "WORLD_SIZE=two", "MASTER_ADDR=127.0.0.1"}, "WORLD_SIZE='two' is not an integer"},
      {{"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=" + std::to_string(port)},
       "MASTER_ADDR is not set but WORLD_SIZE=2"},
      {{"RANK=0", "WORLD_SIZE=1", "TANDEM_TIMEOUT_S=soon"},
       "TANDEM_TIMEOUT_S: comm.timeout_s expects a float (> 0), got 'soon'"},
      {{"RANK=0", "WORLD_SIZE=1", "TANDEM_SHM=yes"},
       "TANDEM_SHM: comm.shared_memory expects a bool (true | false), got 'yes'"},
  };
  for (const auto& c : cases) {
    auto env = clean_env();
    env.insert(env.end(), c.env.begin(), c.env.end());
    const RunResult r = start_worker(env, "init-only")->finish(20s);
    ASSERT_TRUE(r.exited);
    EXPECT_EQ(r.exit_code, 4) << r.out;
    EXPECT_TRUE(contains(r.out, "tandem error (ConfigError)")) << r.out;
    EXPECT_TRUE(contains(r.out, c.message)) << r.out;
    EXPECT_LT(r.seconds, 15.0);
  }
}

TEST(Multiprocess, PortInUseOnRankZeroIsAConfigError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const RunResult r = start_worker(rank_env(0, 2, port, "2"), "init-only")->finish(30s);
  ::close(fd);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "port " + std::to_string(port) + ": the port is already in use"))
      << r.out;
}

}  // namespace
}  // namespace tandem
