// Step-level fault tolerance across nodes (docs/fault_tolerance.md "Several nodes"): two tandemrun
// agents with --ft, two workers each (tests/fault/ft_worker.cpp). The agent that hosts the
// rendezvous serves the workers' store; the other reports its dead workers into it.
// - A worker killed on the other node costs one step, and the run ends as its failure schedule.
// - A network partition between two hosts (network namespaces joined by veth, made by the test;
//   root only): the side cut off from the rendezvous host stops its workers and commits nothing,
//   the other side goes on at half the size and ends as its failure schedule. Never both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/fault/ft_harness.h"

namespace tandem::launcher_test {
namespace {

constexpr const char* kToken = "ft-multinode-test-token";
constexpr int kLongSteps = 60;  // ~10 s at --pause-ms 150: the cut comes mid-run

std::vector<std::string> agent_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (const auto& e : clean_env()) {
    if (e.rfind("TANDEM_JOB_TOKEN=", 0) != 0) env.push_back(e);
  }
  env.push_back(std::string("TANDEM_JOB_TOKEN=") + kToken);
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// tandemrun's arguments for node `node_rank` of a 2-node --ft job whose rendezvous is `endpoint`,
// then ft_worker's.
std::vector<std::string> agent_args(int node_rank, const std::string& endpoint,
                                    const std::vector<std::string>& launcher_extra,
                                    const std::vector<std::string>& worker_args) {
  std::vector<std::string> args{"--nnodes", "2", "--nproc-per-node", "2", "--node-rank",
                                std::to_string(node_rank), "--rdzv-endpoint", endpoint,
                                "--rdzv-node-timeout-s", "3", "--rdzv-join-timeout-s", "30",
                                "--grace-period-s", "2", "--ft"};
  args.insert(args.end(), launcher_extra.begin(), launcher_extra.end());
  args.push_back(worker_path());
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  args.insert(args.end(), {"--set", "ft.enabled=true"});
  return args;
}

bool wait_err(TandemrunProcess& p, const std::string& needle, std::chrono::milliseconds timeout) {
  return p.read_until([&] { return p.err().find(needle) != std::string::npos; }, timeout);
}

// Asserts what the survivors printed: none restarted, all in one final epoch of `members` since
// the same step, which they return.
int check_survivors(const std::string& out, const std::string& members, std::size_t count) {
  const Survivors s = parse(out);
  EXPECT_EQ(s.done_pid.size(), count) << out;
  for (const auto& [rank, pid] : s.done_pid) EXPECT_EQ(s.start_pid.at(rank), pid) << out;
  EXPECT_EQ(s.members, std::set<std::string>{members}) << out;
  EXPECT_EQ(s.aborted, std::set<int>{1}) << out;
  EXPECT_EQ(s.since.size(), 1u) << out;
  return s.since.empty() ? -1 : *s.since.begin();
}

// Rank 3 (node 1, the agent that does not host the rendezvous) is SIGKILLed at step 2: node 1's
// agent reports it into the store node 0's agent serves, ranks 0-2 drop that step and go on, and
// both agents end successfully.
TEST(StepFaultToleranceAcrossNodes, AWorkerKilledOnTheOtherNodeCostsOneStep) {
  TempDir dir("ft_nodes");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_loopback_port());
  const auto env = agent_env({"FT_KILL_RANKS=3", "FT_KILL_STEP=2", "FT_KILL_AT=backward"});
  const std::vector<std::string> worker{"--out", dir.path + "/params.bin"};
  TandemrunProcess host(agent_args(0, endpoint, {}, worker), env);
  ASSERT_TRUE(wait_err(host, "hosting the rendezvous", 20s)) << host.err();
  TandemrunProcess other(agent_args(1, endpoint, {}, worker), env);
  const RunResult a = host.finish(90s), b = other.finish(30s);
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  ASSERT_EQ(b.exit_code, 0) << b.err << b.out;
  EXPECT_NE(b.err.find("rank 3 was killed by signal 9 (SIGKILL); the other workers drop the step "
                       "and go on without it (--ft)"),
            std::string::npos)
      << b.err;
  EXPECT_EQ(a.err.find("restarting"), std::string::npos) << a.err;
  const int since = check_survivors(a.out + b.out, "0,1,2", 3);
  EXPECT_EQ(since, 2);
  EXPECT_EQ(read_file(dir.path + "/params.bin"), reference(4, 1, 2))
      << "the survivors' parameters differ from the run with the same failure schedule";
}

// Two hosts of their own: network namespaces joined by a veth pair, removed at destruction.
struct TwoHosts {
  std::string ip, ns_a, ns_b, link_a, link_b;
  std::string addr_a = "10.213.7.1", addr_b = "10.213.7.2";
  bool ok = false;

  TwoHosts() {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
      if (::access(p, X_OK) == 0) {
        ip = p;
        break;
      }
    }
    if (ip.empty() || ::geteuid() != 0) return;
    const std::string tag = "tft" + std::to_string(::getpid());
    ns_a = tag + "a";
    ns_b = tag + "b";
    link_a = tag + "a";
    link_b = tag + "b";
    ok = run(ip + " netns add " + ns_a) && run(ip + " netns add " + ns_b) &&
         run(ip + " link add " + link_a + " netns " + ns_a + " type veth peer name " + link_b +
             " netns " + ns_b) &&
         in(ns_a, "link set " + link_a + " up") && in(ns_b, "link set " + link_b + " up") &&
         in(ns_a, "link set lo up") && in(ns_b, "link set lo up") &&
         // Each host's address is on its loopback, so that it stays when the cable goes.
         in(ns_a, "addr add " + addr_a + "/32 dev lo") &&
         in(ns_b, "addr add " + addr_b + "/32 dev lo") &&
         in(ns_a, "route add " + addr_b + "/32 dev " + link_a + " src " + addr_a) &&
         in(ns_b, "route add " + addr_a + "/32 dev " + link_b + " src " + addr_b);
  }
  ~TwoHosts() {
    if (!ns_a.empty()) run(ip + " netns del " + ns_a + " 2>/dev/null");
    if (!ns_b.empty()) run(ip + " netns del " + ns_b + " 2>/dev/null");
  }
  static bool run(const std::string& command) { return std::system(command.c_str()) == 0; }
  bool in(const std::string& ns, const std::string& command) const {
    return run(ip + " netns exec " + ns + " " + ip + " " + command);
  }
  // Cuts the cable: the pair goes with either end (and the routes over it), and nothing tells
  // the sockets that crossed it.
  bool cut() const { return in(ns_a, "link del " + link_a); }
  // A command line that runs tandemrun with `args` on host `ns`.
  std::vector<std::string> tandemrun_on(const std::string& ns,
                                        const std::vector<std::string>& args) const {
    std::vector<std::string> argv{ip, "netns", "exec", ns, tandemrun_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
};

// The partition: host A runs the rendezvous (and so the workers' store), host B the other node.
// The cable is cut mid-run. B's agent loses the rendezvous within --rdzv-node-timeout-s and
// stops its workers, which commit nothing more (every decision is a compare-and-set in A's
// store). A's agent reports B's ranks dead once B's keep-alive stops; A's workers, whose
// collectives with B fail after comm.timeout_s, abort that step, re-form as ranks 0,1 without
// waiting for B, and finish bitwise equal to the schedule "4 ranks up to that step, 2 after".
// The two namespaces share one kernel, so the shared-memory channel would reach across the cut:
// it is off.
TEST(StepFaultToleranceAcrossNodes, APartitionStopsTheSideWithoutTheRendezvousAndTheOtherGoesOn) {
  TwoHosts hosts;
  if (!hosts.ok) GTEST_SKIP() << "needs root and iproute2 to make two network namespaces";
  TempDir dir("ft_partition");
  const std::string endpoint = hosts.addr_a + ":29400";
  const std::vector<std::string> worker{"--steps", std::to_string(kLongSteps), "--pause-ms", "150",
                                        "--set", "comm.timeout_s=5", "--set", "ft.quorum_timeout_s=3",
                                        "--set", "comm.shared_memory=false"};
  auto args = [&](int node, const std::string& addr, const std::string& out) {
    std::vector<std::string> w{"--out", out};
    w.insert(w.end(), worker.begin(), worker.end());
    return agent_args(node, endpoint, {"--local-addr", addr}, w);
  };
  const std::string out_a = dir.path + "/a.bin", out_b = dir.path + "/b.bin";
  TandemrunProcess a(hosts.tandemrun_on(hosts.ns_a, args(0, hosts.addr_a, out_a)),
                     agent_env({"TANDEM_GLOO_HOSTNAME=" + hosts.addr_a}), false);
  ASSERT_TRUE(wait_err(a, "hosting the rendezvous", 20s)) << a.err();
  TandemrunProcess b(hosts.tandemrun_on(hosts.ns_b, args(1, hosts.addr_b, out_b)),
                     agent_env({"TANDEM_GLOO_HOSTNAME=" + hosts.addr_b}), false);
  // Both nodes train (each prints its workers' start), then a few steps more.
  ASSERT_TRUE(b.wait_for_stdout_count("ft start pid", 2, 60s)) << b.err() << b.out();
  ASSERT_TRUE(a.wait_for_stdout_count("ft start pid", 2, 10s)) << a.err() << a.out();
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(hosts.cut());
  const RunResult rb = b.finish(40s);
  const RunResult ra = a.finish(90s);
  // B: stopped, with why, and its workers never finished.
  ASSERT_FALSE(rb.timed_out) << rb.err << rb.out;
  EXPECT_EQ(rb.exit_code, 1) << rb.err << rb.out;
  EXPECT_NE(rb.err.find("cut off from the agent"), std::string::npos) << rb.err;
  EXPECT_EQ(rb.out.find("ft done"), std::string::npos) << rb.out;
  EXPECT_TRUE(read_file(out_b).empty());
  // A: went on without B's ranks, in the same processes, to the end.
  ASSERT_FALSE(ra.timed_out) << ra.err << ra.out;
  ASSERT_EQ(ra.exit_code, 0) << ra.err << ra.out;
  EXPECT_NE(ra.err.find("node 1 (" + hosts.addr_b + ") was lost"), std::string::npos) << ra.err;
  EXPECT_EQ(ra.err.find("restarting"), std::string::npos) << ra.err;
  const int since = check_survivors(ra.out, "0,1", 2);
  ASSERT_GT(since, 0) << ra.out;
  ASSERT_LT(since, kLongSteps) << "the cut came after the run: " << ra.out;
  EXPECT_EQ(read_file(out_a), reference(4, 2, since, kLongSteps, {"comm.shared_memory=false"}))
      << "the survivors' parameters differ from the run with the same failure schedule";
}

}  // namespace
}  // namespace tandem::launcher_test
