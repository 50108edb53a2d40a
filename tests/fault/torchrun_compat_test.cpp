// The same training binary (tests/fault/fault_worker) under torchrun (the torch wheel's, from the
// venv tandem is built against) and under tandemrun: same seed, same world size, same final
// parameter bytes; and torchrun's failure summary shows the message tandem::run_main wrote to
// TORCHELASTIC_ERROR_FILE (ctest label `torchrun`).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

namespace fs = std::filesystem;

// A port the kernel reports free on 127.0.0.1 (another process could take it before torchrun
// binds it; the window is short).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

class TorchrunCompatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(TORCHRUN, X_OK), 0) << TORCHRUN " is missing: run scripts/install-deps";
    char dir[] = "/tmp/tandem_torchrun_XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  std::vector<std::string> env_with(const std::vector<std::string>& extra) const {
    std::vector<std::string> env = clean_env();
    env.push_back("TANDEM_TIMEOUT_S=60");
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }

  std::vector<std::string> worker(const std::string& name) const {
    return {worker_path(), "--ckpt", dir_ + "/" + name + ".ckpt", "--out",
            dir_ + "/" + name + ".params", "--steps", "12", "--every", "3"};
  }

  RunResult torchrun(const std::string& name, const std::vector<std::string>& fault_env) {
    // A c10d rendezvous on a port of our own, so that two torchruns at once (ctest -j) never
    // meet in one rendezvous.
    const int port = free_port();
    if (port == 0) ADD_FAILURE() << "no free port on 127.0.0.1";
    std::vector<std::string> args{TORCHRUN, "--nnodes", "1", "--nproc_per_node", "2",
                                  "--rdzv_backend", "c10d", "--rdzv_endpoint",
                                  "127.0.0.1:" + std::to_string(port), "--max_restarts", "0",
                                  "--monitor_interval", "0.1", "--no_python"};
    const auto w = worker(name);
    args.insert(args.end(), w.begin(), w.end());
    TandemrunProcess run(args, env_with(fault_env), /*through_tandemrun=*/false);
    return run.finish(100s);
  }

  RunResult tandemrun(const std::string& name) {
    std::vector<std::string> args{"--nproc-per-node", "2", "--standalone"};
    const auto w = worker(name);
    args.insert(args.end(), w.begin(), w.end());
    return run_tandemrun(args, env_with({}), 60s);
  }

  std::string dir_;
};

TEST_F(TorchrunCompatTest, SameBinaryEndsWithIdenticalParametersUnderBothLaunchers) {
  const RunResult t = torchrun("torchrun", {});
  ASSERT_FALSE(t.timed_out) << t.out << t.err;
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
  // torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE): rank 0 must join it, not
  // try to bind its port (libtorch logs that failure and falls back).
  EXPECT_EQ(t.err.find("failed to bind"), std::string::npos) << t.err;
  EXPECT_EQ(t.out.find("failed to bind"), std::string::npos) << t.out;
  const RunResult r = tandemrun("tandemrun");
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string a = read_file(dir_ + "/torchrun.params");
  const std::string b = read_file(dir_ + "/tandemrun.params");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "final parameters differ between torchrun and tandemrun";
}

TEST_F(TorchrunCompatTest, TorchrunSummaryShowsTandemsErrorFileMessage) {
  const RunResult t =
      torchrun("raise", {"FAULT_RANK=1", "FAULT_STEP=5", "FAULT_KIND=always-raise"});
  ASSERT_FALSE(t.timed_out) << t.out << t.err;
  EXPECT_NE(t.exit_code, 0);
  // torchrun's ChildFailedError summary: the failed rank and tandem's message from its error file.
  EXPECT_NE(t.err.find("ChildFailedError"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("rank      : 1"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("std::runtime_error: injected failure at step 5"), std::string::npos)
      << t.err;
  EXPECT_EQ(t.err.find("To enable traceback see"), std::string::npos)
      << "torchrun found no error file: " << t.err;
}

}  // namespace
}  // namespace tandem::launcher_test
