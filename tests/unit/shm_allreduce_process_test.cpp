// Shared-memory allreduce with ranks as real processes: the test binary re-executes itself as a
// worker (ShmAllreduceWorker), two ranks over a FileStore. A peer killed or stopped mid-allreduce
// fails the other rank long before the timeout, and nothing is left in /dev/shm after a SIGKILL.
// One more test, skipped unless TANDEM_SHM_BENCH is set, prints timings of two processes, shared
// memory versus TCP.
#include "tests/support/test_support.h"
#include "tests/unit/shm_test_util.h"

#include "collectives/shm/shm_segment.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/gloo_communicator.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace tandem {
namespace {

using namespace std::chrono_literals;
using namespace shm_test;
using detail::ShmSegment;

// ---- ranks as real processes: the test binary re-executes itself as a worker ----------------

constexpr const char* kRoleVar = "TANDEM_SHM_TEST_ROLE";

// Output of a worker goes to a file; every wait on it is bounded.
struct Worker {
  pid_t pid = -1;
  std::string out_path;
  int status = 0;
  bool reaped = false;

  std::string output() const {
    std::ifstream in(out_path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  bool wait_for_output(const std::string& needle, std::chrono::milliseconds timeout) const {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (output().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  // Reaps within `timeout`; SIGKILLs it after that (returns false).
  bool reap(std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (!reaped) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        reaped = true;
        break;
      }
      if (Clock::now() >= end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        reaped = true;
        return false;
      }
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }
  ~Worker() {
    if (pid > 0 && !reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
};

std::unique_ptr<Worker> spawn_worker(const std::string& dir, int rank, const std::string& role,
                                     const std::string& timeout_ms) {
  auto w = std::make_unique<Worker>();
  w->out_path = dir + "/rank" + std::to_string(rank) + ".out";
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back(std::string(kRoleVar) + "=" + role);
  env.push_back("TANDEM_SHM_TEST_RANK=" + std::to_string(rank));
  env.push_back("TANDEM_SHM_TEST_STORE=" + dir + "/store");
  env.push_back("TANDEM_SHM_TEST_TIMEOUT_MS=" + timeout_ms);
  env.push_back("OMP_NUM_THREADS=1");
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter = "--gtest_filter=ShmAllreduceWorker.RunsTheRoleFromTheEnvironment";
  std::vector<char*> argv = {exe.data(), filter.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, w->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int rc = ::posix_spawn(&w->pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::string(std::strerror(rc)));
  return w;
}

std::string make_temp_dir() {
  char tmpl[] = "/tmp/tandem-shm-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  if (d == nullptr) throw std::runtime_error("mkdtemp failed");
  return d;
}

// Worker "loop": allreduces 16 MiB (16 pipeline steps) until the test stops or kills the peer;
// prints what it caught. Worker "gather_loop": the same with all-gathers of 8 MiB per rank (the
// one-copy path, which reads the peer's memory, where the processes may).
int worker_loop(Communicator& comm, bool gather) {
  auto t = at::ones({(16 << 20) / 4});
  auto piece = at::ones({(8 << 20) / 4});
  const auto deadline = Clock::now() + 60s;
  Clock::time_point start;
  try {
    for (int i = 0; Clock::now() < deadline; ++i) {
      start = Clock::now();
      (gather ? comm.allgather(t, piece) : comm.allreduce(t))->wait();
      if (i == 0) {
        std::printf("RUNNING\n");
        std::fflush(stdout);
      }
    }
    std::printf("no error within 60 s\n");
  } catch (const TimeoutError& e) {
    std::printf("CAUGHT TimeoutError after %.2f s: %s\n", seconds_since(start), e.what());
    return 0;
  } catch (const CommError& e) {
    std::printf("CAUGHT CommError after %.2f s: %s\n", seconds_since(start), e.what());
    return 0;
  }
  return 1;
}

double process_cpu_seconds() {
  rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Worker "bench": float32 sum allreduce, reduce-scatter and all-gather over TCP
// (shared_memory = false) and shared memory, alternating, five rounds; rank 0 prints the median
// and best wall time per op (the slower rank's) and the median CPU time per op and rank (all
// threads of the process). A size is the whole tensor: the allreduce's, the reduce-scatter's
// input, the all-gather's output. All-gathers also run through shared memory with peer reads off
// ("shm2": two copies per element, through the segment).
int worker_bench(Communicator& shm, Communicator& tcp, Communicator& shm2) {
  struct Size {
    int64_t bytes;
    int iterations;
  };
  const Size sizes[] = {{4 << 10, 2000}, {1 << 20, 200}, {4 << 20, 100}, {16 << 20, 30}, {64 << 20, 10}};
  const double p = shm.size();
  for (const Size& size : sizes) {
    const int64_t n = size.bytes / 4;
    auto whole = at::ones({n});
    auto part = at::ones({n / shm.size()});
    // Bus bandwidth: bytes * 2 (p - 1) / p / time for an allreduce, bytes * (p - 1) / p for the
    // other two (each moves half an allreduce's traffic).
    struct Op {
      const char* name;
      double traffic;
      std::function<WorkPtr(Communicator&)> run;
    };
    const Op ops[] = {
        {"allreduce", 2 * (p - 1) / p, [&](Communicator& c) { return c.allreduce(whole); }},
        {"reduce_scatter", (p - 1) / p,
         [&](Communicator& c) { return c.reduce_scatter(part, whole); }},
        {"allgather", (p - 1) / p, [&](Communicator& c) { return c.allgather(whole, part); }},
    };
    for (const Op& op : ops) {
      std::vector<Communicator*> comms = {&tcp, &shm};
      if (std::string(op.name) == "allgather") comms.push_back(&shm2);
      for (Communicator* comm : comms) {
        std::vector<double> wall, cpu;
        for (int round = 0; round < 5; ++round) {
          op.run(*comm)->wait();  // warm-up
          comm->barrier()->wait();
          const double cpu0 = process_cpu_seconds();
          const auto start = Clock::now();
          for (int i = 0; i < size.iterations; ++i) op.run(*comm)->wait();
          auto stats = at::tensor({seconds_since(start), process_cpu_seconds() - cpu0}, at::kDouble);
          comm->allreduce(stats, ReduceOp::kMax)->wait();
          wall.push_back(stats[0].item<double>() / size.iterations);
          cpu.push_back(stats[1].item<double>() / size.iterations);
        }
        std::sort(wall.begin(), wall.end());
        std::sort(cpu.begin(), cpu.end());
        if (comm->rank() == 0) {
          std::printf("BENCH %-14s %-5s %9.0f KiB: median %8.3f ms (best %8.3f)  bus bandwidth "
                      "%6.2f GB/s (best %6.2f)  CPU %8.3f ms/op/rank\n",
                      op.name, comm == &shm ? "shm" : comm == &tcp ? "tcp" : "shm2", size.bytes / 1024.0, wall[2] * 1e3,
                      wall[0] * 1e3, size.bytes * op.traffic / wall[2] / 1e9,
                      size.bytes * op.traffic / wall[0] / 1e9, cpu[2] * 1e3);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

// Worker side of the multi-process tests: two ranks over a FileStore.
TEST(ShmAllreduceWorker, RunsTheRoleFromTheEnvironment) {
  const char* role = std::getenv(kRoleVar);
  if (role == nullptr) GTEST_SKIP() << "helper for the multi-process tests below";
  if (std::string(role) == "abandon") {  // a creator killed between creating and publishing
    ShmSegment segment = ShmSegment::create(std::getenv("TANDEM_SHM_TEST_NAME"), 4096);
    std::printf("CREATED\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(60s);
    std::_Exit(1);
  }
  const int rank = std::atoi(std::getenv("TANDEM_SHM_TEST_RANK"));
  auto store = c10::make_intrusive<c10d::FileStore>(std::getenv("TANDEM_SHM_TEST_STORE"), 2);
  const auto timeout =
      std::chrono::milliseconds(std::atoi(std::getenv("TANDEM_SHM_TEST_TIMEOUT_MS")));
  int rc = 1;
  {
    auto comm = connect_gloo(store, rank, 2, shm_options(1 << 20, timeout));
    std::printf("CONNECTED rank %d pid %d mappings %d files %d\n", rank, int(::getpid()),
                shm_mappings(), shm_files_of(::getpid()));
    std::fflush(stdout);
    if (std::string(role) == "bench") {
      GlooOptions tcp = tcp_options();
      tcp.timeout = timeout;
      GlooOptions two_copies = shm_options(1 << 20, timeout);
      two_copies.shared_memory_peer_reads = false;
      two_copies.store_prefix = "shm2";
      rc = worker_bench(*comm, *connect_gloo(store, rank, 2, tcp),
                        *connect_gloo(store, rank, 2, two_copies));
    } else {
      rc = worker_loop(*comm, std::string(role) == "gather_loop");
    }
  }
  std::fflush(stdout);
  std::_Exit(rc);
}

struct ProcessCase {
  int victim;      // rank the test stops or kills mid-allreduce
  int signal;      // SIGKILL or SIGSTOP
  const char* timeout_ms;
  const char* caught;
  const char* role = "loop";  // or "gather_loop"
};

void run_process_case(const ProcessCase& c) {
  const std::string dir = make_temp_dir();
  auto r0 = spawn_worker(dir, 0, c.role, c.timeout_ms);
  auto r1 = spawn_worker(dir, 1, c.role, c.timeout_ms);
  Worker* workers[2] = {r0.get(), r1.get()};
  for (Worker* w : workers) {
    ASSERT_TRUE(w->wait_for_output("RUNNING", 40s)) << w->output();
    EXPECT_NE(w->output().find("mappings 1 files 0"), std::string::npos) << w->output();
  }
  std::this_thread::sleep_for(200ms);  // well inside the loop of allreduces
  Worker* victim = workers[c.victim];
  Worker* survivor = workers[1 - c.victim];
  ASSERT_EQ(::kill(victim->pid, c.signal), 0);
  const auto start = Clock::now();
  // The victim stays unreaped (a zombie after SIGKILL) until the survivor is done.
  EXPECT_TRUE(survivor->reap(30s)) << survivor->output();
  const double took = seconds_since(start);
  ::kill(victim->pid, SIGKILL);
  victim->reap(10s);
  const std::string out = survivor->output();
  EXPECT_TRUE(WIFEXITED(survivor->status) && WEXITSTATUS(survivor->status) == 0) << out;
  EXPECT_NE(out.find(c.caught), std::string::npos) << out;
  const std::string op = std::string(c.role) == "loop" ? "allreduce #" : "allgather #";
  EXPECT_NE(out.find(op), std::string::npos) << out;
  EXPECT_LT(took, 20.0) << out;
  // Nothing left in /dev/shm by the creator (rank 0), whichever rank died.
  EXPECT_EQ(shm_files_of(r0->pid), 0);
  std::remove((dir + "/rank0.out").c_str());
  std::remove((dir + "/rank1.out").c_str());
  std::remove((dir + "/store").c_str());
  ::rmdir(dir.c_str());
}

TEST(ShmAllreduceProcesses, PeerKilledMidAllreduceRaisesCommErrorLongBeforeTheTimeout) {
  run_process_case({1, SIGKILL, "30000", "CAUGHT CommError"});
}

TEST(ShmAllreduceProcesses, CreatorKilledMidAllreduceRaisesCommError) {
  run_process_case({0, SIGKILL, "30000", "CAUGHT CommError"});
}

TEST(ShmAllreduceProcesses, PeerStoppedMidAllreduceRaisesTimeoutError) {
  run_process_case({1, SIGSTOP, "2000", "CAUGHT TimeoutError"});
}

TEST(ShmAllreduceProcesses, PeerKilledMidAllgatherRaisesCommErrorLongBeforeTheTimeout) {
  run_process_case({1, SIGKILL, "30000", "CAUGHT CommError", "gather_loop"});
}

TEST(ShmAllreduceProcesses, PeerStoppedMidAllgatherRaisesTimeoutError) {
  run_process_case({1, SIGSTOP, "2000", "CAUGHT TimeoutError", "gather_loop"});
}

bool shm_name_exists(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

// Issue 20 item 9: a creator SIGKILLed inside connect, before it published the segment's name,
// left the name in /dev/shm for good. The next connect removes such names: old enough and with
// nobody holding the creator's presence byte; a live creator's segment stays.
TEST(ShmAllreduceProcesses, SegmentOfACreatorKilledInsideConnectIsRemovedLater) {
  const std::string dir = make_temp_dir();
  const std::string prefix = "/tandem-shm-abandon-test-" + std::to_string(::getpid()) + "-";
  const std::string dead = prefix + "dead";
  const std::string alive = prefix + "alive";
  ShmSegment mine = ShmSegment::create(alive, 4096);
  ::setenv("TANDEM_SHM_TEST_NAME", dead.c_str(), 1);
  auto creator = spawn_worker(dir, 0, "abandon", "1000");
  ::unsetenv("TANDEM_SHM_TEST_NAME");
  ASSERT_TRUE(creator->wait_for_output("CREATED", 40s)) << creator->output();
  ASSERT_EQ(::kill(creator->pid, SIGKILL), 0);
  ASSERT_TRUE(creator->reap(10s));
  ASSERT_TRUE(shm_name_exists(dead)) << "the leak this test is about";
  // Too young to tell from a creator that has not taken its lock yet: kept.
  EXPECT_EQ(ShmSegment::remove_abandoned(prefix, 3600s), 0);
  EXPECT_TRUE(shm_name_exists(dead));
  EXPECT_EQ(ShmSegment::remove_abandoned(prefix, 0s), 1);
  EXPECT_FALSE(shm_name_exists(dead));
  EXPECT_TRUE(shm_name_exists(alive)) << "a live creator's segment was removed";
  mine.unlink();
  std::remove((dir + "/rank0.out").c_str());
  ::rmdir(dir.c_str());
}

// Not a check: prints allreduce, reduce-scatter and all-gather timings of two processes, shared
// memory versus TCP loopback (docs/collectives.md quotes it):
//   TANDEM_SHM_BENCH=1 build/bin/tandem_unit_tests --gtest_filter='ShmCollectivesBench.*'
TEST(ShmCollectivesBench, TwoProcessesSharedMemoryVersusTcp) {
  if (std::getenv("TANDEM_SHM_BENCH") == nullptr) GTEST_SKIP() << "set TANDEM_SHM_BENCH=1 to run";
  const std::string dir = make_temp_dir();
  auto r0 = spawn_worker(dir, 0, "bench", "60000");
  auto r1 = spawn_worker(dir, 1, "bench", "60000");
  EXPECT_TRUE(r0->reap(600s));
  EXPECT_TRUE(r1->reap(60s));
  std::istringstream out(r0->output());
  for (std::string line; std::getline(out, line);) {
    if (line.rfind("BENCH", 0) == 0) std::printf("%s\n", line.c_str());
  }
  EXPECT_TRUE(WIFEXITED(r0->status) && WEXITSTATUS(r0->status) == 0) << r1->output();
  std::remove((dir + "/rank0.out").c_str());
  std::remove((dir + "/rank1.out").c_str());
  std::remove((dir + "/store").c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace tandem
