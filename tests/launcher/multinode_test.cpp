// tandemrun's multi-node rendezvous, black-box: two agents as two "nodes" on 127.0.0.1 with the
// torch-free test worker. The torchrun environment across nodes, the job token (a foreign job is
// turned away with the documented message), an unreachable endpoint, and a node that arrives
// after the job's only round closed (it waits, and exits 0 when the job finishes).
// Training across membership changes is in tests/fault/multinode_fault_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <tandem/base/errors.h>

#include "tests/launcher/tandemrun_process.h"
#include "tools/tandemrun/elastic/job_token.h"

namespace tandem::launcher_test {
namespace {

std::vector<std::string> env_with_token(const std::string& token) {
  std::vector<std::string> env;
  for (const auto& e : clean_env()) {
    if (e.rfind("TANDEM_JOB_TOKEN=", 0) != 0) env.push_back(e);
  }
  if (!token.empty()) env.push_back("TANDEM_JOB_TOKEN=" + token);
  return env;
}

// "[rank R]: KEY=VALUE" lines -> rank -> key -> value.
std::map<int, std::map<std::string, std::string>> worker_env(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> env;
  for (const auto& line : split_lines(out)) {
    int rank = -1;
    char rest[512] = {};
    if (std::sscanf(line.c_str(), "[rank %d]: %511[^\n]", &rank, rest) != 2) continue;
    const std::string kv = rest;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

bool wait_err(TandemrunProcess& p, const std::string& needle) {
  return p.read_until([&] { return p.err().find(needle) != std::string::npos; }, 10s);
}

// Two agents x two workers, node rank 0 hosting the store at --master-addr:--master-port: every
// worker sees a consistent torchrun environment for a world of 4.
TEST(MultiNodeTest, TwoAgentsTwoWorkersEachGetTheTorchrunEnvironment) {
  const std::string port = std::to_string(free_loopback_port());
  auto args = [&](const std::string& node_rank) {
    return std::vector<std::string>{"--nnodes", "2", "--node_rank", node_rank,
                                    "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                                    "--master-port", port, "--rdzv-id", "job7", worker_path(),
                                    "env"};
  };
  TandemrunProcess a(args("0"), env_with_token("token-of-job-7"));
  TandemrunProcess b(args("1"), env_with_token("token-of-job-7"));
  const RunResult ra = a.finish(20s);
  const RunResult rb = b.finish(20s);
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  EXPECT_NE(ra.err.find("hosting the rendezvous at 127.0.0.1:" + port), std::string::npos)
      << ra.err;
  auto env = worker_env(ra.out);
  for (const auto& [rank, vars] : worker_env(rb.out)) env[rank] = vars;
  ASSERT_EQ(env.size(), 4u) << ra.out << rb.out;
  std::set<std::string> master_ports;
  for (int rank = 0; rank < 4; ++rank) {
    auto& v = env[rank];
    EXPECT_EQ(v["RANK"], std::to_string(rank));
    EXPECT_EQ(v["GROUP_RANK"], std::to_string(rank / 2));
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(v["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(v["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(v["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(v["TORCHELASTIC_RUN_ID"], "job7");
    master_ports.insert(v["MASTER_PORT"]);
  }
  // One workers' store for the whole world, not the agents' rendezvous port.
  EXPECT_EQ(master_ports.size(), 1u);
  EXPECT_EQ(master_ports.count(port), 0u);
}

// An agent with another job token is turned away with the documented message and starts no
// worker; the host logs it and keeps waiting for its own nodes.
TEST(MultiNodeTest, ForeignJobTokenIsRejected) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_loopback_port());
  auto args = [&] {
    return std::vector<std::string>{"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                                    endpoint, worker_path(), "env"};
  };
  TandemrunProcess host(args(), env_with_token("the-real-token"));
  ASSERT_TRUE(wait_err(host, "hosting the rendezvous")) << host.err();
  const RunResult foreign = run_tandemrun(args(), env_with_token("some-other-token"), 15s);
  EXPECT_EQ(foreign.exit_code, 1) << foreign.err;
  EXPECT_NE(foreign.err.find("tandemrun: error: the rendezvous at " + endpoint +
                             " belongs to another job (job token differs); set "
                             "TANDEM_JOB_TOKEN to this job's token or use another "
                             "--rdzv-endpoint"),
            std::string::npos)
      << foreign.err;
  EXPECT_EQ(foreign.out, "") << "no worker may run";
  EXPECT_TRUE(wait_err(host, "turned away 1 agent(s) of another job")) << host.err();
  EXPECT_EQ(host.out(), "") << "the host's round must still be open";
  host.send(SIGTERM);
  const RunResult rh = host.finish(10s);
  EXPECT_EQ(rh.exit_code, 128 + SIGTERM) << rh.err;
}

// A client whose store host never comes gives up after --rdzv-join-timeout-s, naming the
// endpoint.
TEST(MultiNodeTest, UnreachableEndpointIsNamed) {
  const std::string port = std::to_string(free_loopback_port());
  const RunResult r = run_tandemrun(
      {"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-port", port,
       "--rdzv-join-timeout-s", "1", worker_path(), "env"},
      env_with_token("token-nobody-hosts"), 15s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot reach the rendezvous at 127.0.0.1:" + port), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
}

// --nnodes 1:2: node A's round closes after the last call with one node; node B arrives later,
// waits for a restart that never comes, and exits 0 when the job has finished.
TEST(MultiNodeTest, NodeStillWaitingWhenTheJobFinishesExitsZero) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_loopback_port());
  auto args = [&] {
    return std::vector<std::string>{"--nnodes", "1:2", "--nproc-per-node", "1",
                                    "--rdzv-endpoint", endpoint, "--rdzv-last-call-s", "0.2",
                                    worker_path(), "no-heartbeat", "5000"};
  };  // A's worker runs long enough for B to start and load the store module on a busy machine
  TandemrunProcess a(args(), env_with_token("late-node-token"));
  ASSERT_TRUE(wait_err(a, "round 0: node rank 0 of 1 nodes")) << a.err();
  TandemrunProcess b(args(), env_with_token("late-node-token"));
  ASSERT_TRUE(wait_err(b, "waiting for the next restart")) << b.err();
  const RunResult ra = a.finish(20s);
  const RunResult rb = b.finish(20s);
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  EXPECT_EQ(rb.exit_code, 0) << rb.err;
  EXPECT_NE(rb.err.find("the job finished while this node waited to be admitted"),
            std::string::npos)
      << rb.err;
  EXPECT_EQ(rb.out, "") << "the late node ran no worker";
}

// Issue 20 item 1 across nodes: a worker on node 1 exits 2 (a configuration error); the agent
// reports it with its reason and both agents stop at once and exit 2, restarts left or not.
TEST(MultiNodeTest, AFailureNoRestartCanFixStopsEveryNode) {
  const std::string port = std::to_string(free_loopback_port());
  auto args = [&](const std::string& node_rank) {
    return std::vector<std::string>{"--nnodes", "2", "--node_rank", node_rank,
                                    "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                                    "--master-port", port, "--max-restarts", "3", worker_path(),
                                    "fail-rank", "1", "2", "200"};
  };
  TandemrunProcess a(args("0"), env_with_token("token-final-1"));
  TandemrunProcess b(args("1"), env_with_token("token-final-1"));
  const RunResult ra = a.finish(30s);
  const RunResult rb = b.finish(30s);
  for (const RunResult* r : {&ra, &rb}) {
    EXPECT_EQ(r->exit_code, 2) << r->err;
    EXPECT_NE(r->err.find("round 0 failed: rank 1 on node 1"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("(a configuration error); a restart cannot fix it; not restarting"),
              std::string::npos)
        << r->err;
    EXPECT_EQ(r->err.find("restarting the workers of every node"), std::string::npos) << r->err;
  }
}

TEST(MultiNodeTest, HelpDocumentsTheRendezvousOptions) {
  const RunResult r = run_tandemrun({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* option :
       {"--nnodes", "MIN:MAX", "--rdzv-backend", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id",
        "--rdzv-token-file", "--rdzv-last-call-s", "--rdzv-join-timeout-s",
        "--rdzv-node-timeout-s", "--local-addr", "TANDEM_JOB_TOKEN"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << option << " missing from:\n" << r.out;
  }
}

// The token comes from TANDEM_JOB_TOKEN first, then the first line of the token file; short or
// unreadable tokens are configuration errors; the digest depends on token, label and nonce.
TEST(JobTokenTest, SourcesValidationAndDigest) {
  using launcher::load_job_token;
  using launcher::token_digest;
  char path[] = "/tmp/tandem_token_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << "from-the-file-123\nsecond line ignored\n";
  EXPECT_EQ(load_job_token({"TANDEM_JOB_TOKEN=from-the-env-456"}, path), "from-the-env-456");
  EXPECT_EQ(load_job_token({"OTHER=1"}, path), "from-the-file-123");
  EXPECT_EQ(load_job_token({}, ""), "");
  EXPECT_THROW(load_job_token({"TANDEM_JOB_TOKEN=short"}, ""), ConfigError);
  EXPECT_THROW(load_job_token({}, std::string(path) + ".missing"), ConfigError);
  std::remove(path);

  const std::string d = token_digest("token-one-123", "host", "nonce1");
  EXPECT_EQ(d.size(), 32u);
  EXPECT_EQ(d, token_digest("token-one-123", "host", "nonce1"));
  EXPECT_NE(d, token_digest("token-two-123", "host", "nonce1"));
  EXPECT_NE(d, token_digest("token-one-123", "join", "nonce1"));
  EXPECT_NE(d, token_digest("token-one-123", "host", "nonce2"));
  EXPECT_EQ(d.find("token-one"), std::string::npos);
}

}  // namespace
}  // namespace tandem::launcher_test
