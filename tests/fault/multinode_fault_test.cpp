// Multi-node fault injection: two tandemrun agents as two "nodes" on 127.0.0.1, running
// tests/fault/elastic_worker (world-size-invariant math). A node is SIGKILLed (--nnodes 1:2: the
// survivor resumes alone), a node arrives late (admitted at the next restart), a worker fails on
// one node (both restart); every recovered job ends bitwise equal to one uninterrupted node. With
// --nnodes 2:2 a lost node is unrecoverable and named as the root cause.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kToken = "multinode-fault-test-token";

// pid of the worker with global rank `rank` from its "pid P rank R restart C" line.
pid_t worker_pid(const std::string& out, int rank) {
  const std::regex line("pid ([0-9]+) rank " + std::to_string(rank) + " restart");
  std::smatch m;
  return std::regex_search(out, m, line) ? static_cast<pid_t>(std::stol(m[1])) : -1;
}

class MultiNodeFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tandem_mnfault_XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    port_ = free_loopback_port();
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  static std::vector<std::string> env_with(const std::vector<std::string>& extra) {
    std::vector<std::string> env;
    for (const auto& e : clean_env()) {
      if (e.rfind("TANDEM_JOB_TOKEN=", 0) != 0) env.push_back(e);
    }
    env.push_back("TANDEM_TIMEOUT_S=20");
    env.push_back(std::string("TANDEM_JOB_TOKEN=") + kToken);
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }

  // One agent ("node") of job `name`: 1 worker, the shared rendezvous endpoint, short timeouts.
  // The last call (how long a round with MIN nodes waits for more) must cover the second agent's
  // start on a loaded machine; a round with MAX nodes closes at once anyway.
  std::vector<std::string> agent(const std::string& name, const std::string& nnodes,
                                 const std::vector<std::string>& extra = {},
                                 const std::string& last_call_s = "4") const {
    std::vector<std::string> args{"--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-endpoint",
                                  "127.0.0.1:" + std::to_string(port_), "--rdzv-last-call-s",
                                  last_call_s,
                                  "--rdzv-node-timeout-s", "2", "--rdzv-join-timeout-s", "20",
                                  "--grace-period-s", "2", "--max-restarts", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {LAUNCHER_TEST_WORKER, "--ckpt", dir_ + "/" + name + ".ckpt", "--out",
                             dir_ + "/" + name + ".params", "--steps", "12", "--every", "3"});
    return args;
  }

  std::string params(const std::string& name) const {
    return read_file(dir_ + "/" + name + ".params");
  }

  // The parameters of one uninterrupted node (1 worker), cached per build of the worker.
  std::string reference() {
    struct stat st {};
    EXPECT_EQ(::stat(LAUNCHER_TEST_WORKER, &st), 0);
    const std::string cache = std::string(FAULT_CACHE_DIR) + "/elastic_reference_" +
                              std::to_string(st.st_mtim.tv_sec) + "_" +
                              std::to_string(st.st_mtim.tv_nsec) + ".params";
    const int lock = ::open((std::string(FAULT_CACHE_DIR) + "/elastic_reference.lock").c_str(),
                            O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    EXPECT_GE(lock, 0);
    ::flock(lock, LOCK_EX);
    std::string bytes = read_file(cache);
    if (bytes.empty()) {
      const RunResult r = run_tandemrun(
          {"--nproc-per-node", "1", "--standalone", LAUNCHER_TEST_WORKER, "--ckpt",
           dir_ + "/reference.ckpt", "--out", dir_ + "/reference.params", "--steps", "12",
           "--every", "3"},
          env_with({}), 40s);
      EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
      bytes = params("reference");
      EXPECT_FALSE(bytes.empty());
      std::ofstream(cache + ".tmp", std::ios::binary) << bytes;
      fs::rename(cache + ".tmp", cache);
    }
    ::close(lock);
    return bytes;
  }

  static bool wait_err(TandemrunProcess& p, const std::string& needle,
                       std::chrono::milliseconds timeout = 20s) {
    return p.read_until([&] { return p.err().find(needle) != std::string::npos; }, timeout);
  }
  static bool wait_out(TandemrunProcess& p, const std::string& needle,
                       std::chrono::milliseconds timeout = 20s) {
    return p.read_until([&] { return p.out().find(needle) != std::string::npos; }, timeout);
  }

  std::string dir_;
  int port_ = 0;
};

// --nnodes 1:2, node B's agent SIGKILLed mid-run: its worker dies with it, node A notices the
// lost node, restarts alone (world size 1) from the last checkpoint and ends bit-identical.
TEST_F(MultiNodeFaultTest, LostNodeSurvivorContinuesAloneBitIdentical) {
  const std::string want = reference();
  const auto env = env_with({"STEP_SLEEP_MS=150"});
  // Round 0 closes as soon as both joined; the long last call only keeps it open for node B on a
  // busy machine (B starting and loading the store module took over 4 s at load 13).
  TandemrunProcess a(agent("lost", "1:2", {}, "12"), env);
  ASSERT_TRUE(wait_err(a, "hosting the rendezvous")) << a.err();
  TandemrunProcess b(agent("lost", "1:2", {}, "12"), env);
  ASSERT_TRUE(wait_out(b, "[rank 1]: step 4 done")) << b.out() << b.err() << a.err();
  const pid_t b_worker = worker_pid(b.out(), 1);
  ASSERT_GT(b_worker, 0) << b.out();
  b.send(SIGKILL);
  const RunResult rb = b.finish(5s);
  EXPECT_EQ(rb.term_signal, SIGKILL);
  EXPECT_TRUE(wait_until_gone(b_worker, 5s)) << "node B's worker " << b_worker << " survived";

  const RunResult ra = a.finish(60s);
  EXPECT_EQ(ra.exit_code, 0) << ra.err << ra.out;
  EXPECT_NE(ra.err.find("node 1 (127.0.0.1) was lost"), std::string::npos) << ra.err;
  EXPECT_NE(ra.err.find("round 1: node rank 0 of 1 nodes, world size 1"), std::string::npos)
      << ra.err;
  const std::regex resumed_alone("restart 1 resumed at step [1-9][0-9]* world 1");
  EXPECT_TRUE(std::regex_search(ra.out, resumed_alone)) << ra.out << ra.err;
  EXPECT_EQ(params("lost"), want) << "final parameters differ from the uninterrupted run";
}

// --nnodes 1:2, node B arrives after round 0 closed: it waits, is admitted when a fault on node A
// restarts the job (round 1, world size 2), and the job ends bit-identical.
TEST_F(MultiNodeFaultTest, LateNodeAdmittedAtRestartBitIdentical) {
  const std::string want = reference();
  const std::string go = dir_ + "/go";
  const auto env = env_with(
      {"FAULT_RANK=0", "FAULT_STEP=5", "FAULT_KIND=raise", "FAULT_WAIT_FILE=" + go});
  TandemrunProcess a(agent("late", "1:2"), env);
  ASSERT_TRUE(wait_err(a, "round 0: node rank 0 of 1 nodes")) << a.err();
  TandemrunProcess b(agent("late", "1:2"), env);
  ASSERT_TRUE(wait_err(b, "waiting for the next restart")) << b.err() << a.err();
  std::ofstream(go) << "go\n";  // now node A's worker fails at step 5

  const RunResult ra = a.finish(60s);
  const RunResult rb = b.finish(20s);
  EXPECT_EQ(ra.exit_code, 0) << ra.err << ra.out;
  EXPECT_EQ(rb.exit_code, 0) << rb.err << rb.out;
  EXPECT_NE(ra.err.find("round 1: node rank 0 of 2 nodes, world size 2"), std::string::npos)
      << ra.err;
  EXPECT_NE(rb.err.find("round 1: node rank 1 of 2 nodes, world size 2"), std::string::npos)
      << rb.err;
  EXPECT_NE(rb.out.find("[rank 1]: restart 1 resumed at step 3 world 2"), std::string::npos)
      << rb.out;
  EXPECT_EQ(params("late"), want) << "final parameters differ from the uninterrupted run";
}

// --nnodes 2:2, a worker on node B throws: node A's workers are restarted too, both resume from
// the checkpoint and the job ends bit-identical.
TEST_F(MultiNodeFaultTest, WorkerFailureOnOneNodeRestartsBothBitIdentical) {
  const std::string want = reference();
  const auto env = env_with({"FAULT_RANK=1", "FAULT_STEP=4", "FAULT_KIND=raise"});
  TandemrunProcess a(agent("both", "2:2"), env);
  ASSERT_TRUE(wait_err(a, "hosting the rendezvous")) << a.err();
  TandemrunProcess b(agent("both", "2:2"), env);
  const RunResult ra = a.finish(60s);
  const RunResult rb = b.finish(20s);
  EXPECT_EQ(ra.exit_code, 0) << ra.err << ra.out;
  EXPECT_EQ(rb.exit_code, 0) << rb.err << rb.out;
  // Node A learnt of node B's failure (rank 1, the injected exception) and restarted its worker.
  EXPECT_NE(ra.err.find("restarting the workers of every node (restart 1 of at most 2)"),
            std::string::npos)
      << ra.err;
  EXPECT_NE(ra.err.find("rank 1 on node 1"), std::string::npos) << ra.err;
  EXPECT_NE(ra.out.find("[rank 0]: restart 1 resumed at step 3 world 2"), std::string::npos)
      << ra.out;
  EXPECT_EQ(params("both"), want) << "final parameters differ from the uninterrupted run";
}

// --nnodes 2:2, node B lost: too few nodes remain; node A gives up (the next round cannot gather
// MIN nodes) and names the lost node as the root cause.
TEST_F(MultiNodeFaultTest, LostNodeBelowMinIsTheRootCause) {
  const auto env = env_with({"STEP_SLEEP_MS=150"});
  auto args = agent("below", "2:2");
  // A short join timeout for the round after the loss.
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--rdzv-join-timeout-s") args[i + 1] = "4";
  }
  TandemrunProcess a(args, env);
  ASSERT_TRUE(wait_err(a, "hosting the rendezvous")) << a.err();
  TandemrunProcess b(args, env);
  ASSERT_TRUE(wait_out(b, "[rank 1]: step 2 done")) << b.out() << b.err() << a.err();
  b.send(SIGKILL);
  b.finish(5s);
  const RunResult ra = a.finish(40s);
  EXPECT_EQ(ra.exit_code, 1) << ra.err;
  EXPECT_NE(ra.err.find("root cause (first failure): node 1 (host 127.0.0.1) was lost"),
            std::string::npos)
      << ra.err;
  EXPECT_NE(ra.err.find("round 1 has 1 of at least 2 nodes"), std::string::npos) << ra.err;
}

}  // namespace
}  // namespace tandem::launcher_test
