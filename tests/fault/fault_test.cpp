// Fault injection through tandemrun with real training workers (tests/fault/fault_worker.cpp):
// a worker is SIGKILLed, throws, hangs (SIGSTOP) or its newest checkpoint is corrupted; tandemrun
// restarts the group, the workers resume from their last valid checkpoint, and the final
// parameters are bitwise equal to an uninterrupted run. An unrecoverable job ends non-zero with a
// summary naming the rank, the exit and the exception.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "tests/fault/fault_fixture.h"
#include "base/launch_contract.h"

namespace tandem::launcher_test {
namespace {

void expect_restarted_once_and_resumed(const RunResult& r) {
  EXPECT_NE(r.err.find("restarting all workers (restart 1 of at most 2)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("all workers exited 0 after 1 restart"), std::string::npos) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "done 12 steps"), 2u) << r.out;
}

TEST_F(FaultTest, SigkilledWorkerRestartsAndEndsBitIdentical) {
  const std::string want = reference();
  const RunResult r =
      run("kill", {"--max-restarts", "2"}, {"FAULT_RANK=1", "FAULT_STEP=7", "FAULT_KIND=kill"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_NE(r.err.find("rank 1 was killed by signal 9 (SIGKILL); restarting"), std::string::npos)
      << r.err;
  // Restart 1 resumed from a checkpoint, not from scratch (async saves: step 6 or, if the save
  // of step 6 was still in flight, step 3).
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(restart 1 resumed at step [36]\n)"))) << r.out;
  EXPECT_EQ(params("kill"), want) << "resumed run differs from the uninterrupted one";
}

// The issue's "random worker at a random step": drawn per run (FAULT_TEST_SEED=<n> replays one);
// the seed is in the test's output. Steps before the first checkpoint resume from scratch.
TEST_F(FaultTest, SigkilledRandomWorkerAtRandomStepEndsBitIdentical) {
  const char* replay = std::getenv("FAULT_TEST_SEED");
  const unsigned seed = replay != nullptr ? static_cast<unsigned>(std::strtoul(replay, nullptr, 10))
                                          : std::random_device{}();
  std::mt19937 rng(seed);
  const int rank = static_cast<int>(rng() % 2);
  const int step = 1 + static_cast<int>(rng() % (kSteps - 1));
  RecordProperty("seed", std::to_string(seed));
  SCOPED_TRACE("FAULT_TEST_SEED=" + std::to_string(seed) + ": rank " + std::to_string(rank) +
               " killed at step " + std::to_string(step));
  std::printf("FAULT_TEST_SEED=%u: SIGKILL rank %d at step %d\n", seed, rank, step);
  const std::string want = reference();
  const RunResult r = run("random", {"--max-restarts", "2"},
                          {"FAULT_RANK=" + std::to_string(rank), "FAULT_STEP=" + std::to_string(step),
                           "FAULT_KIND=kill"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_EQ(params("random"), want) << "resumed run differs from the uninterrupted one";
}

// --standby: the restart hands the workers' environment to processes started ahead (parked in
// tandem::run_main) instead of starting new ones; the result is the same, bit for bit.
TEST_F(FaultTest, SigkilledWorkerWithStandbyRestartsFromStandbyAndEndsBitIdentical) {
  const std::string want = reference();
  const RunResult r = run("standby", {"--max-restarts", "2", "--standby"},
                          {"FAULT_RANK=1", "FAULT_STEP=7", "FAULT_KIND=kill"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_NE(r.err.find("restart 1: 2 of 2 workers taken over from standby processes"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(restart 1 resumed at step [36]\n)"))) << r.out;
  EXPECT_EQ(params("standby"), want) << "resumed run differs from the uninterrupted one";
}

// The control for the equality checks: a resume that loses state (here the optimizer's momentum)
// must be caught by them.
TEST_F(FaultTest, ResumeThatLosesTheMomentumIsNotBitIdentical) {
  const std::string want = reference();
  const RunResult r = run(
      "forget", {"--max-restarts", "2"},
      {"FAULT_RANK=1", "FAULT_STEP=7", "FAULT_KIND=kill", "FAULT_FORGET_OPTIMIZER=1"}, {"--sync"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_NE(r.out.find("restart 1 resumed at step 6\n"), std::string::npos) << r.out;
  const std::string got = params("forget");
  EXPECT_EQ(got.size(), want.size());
  EXPECT_NE(got, want) << "losing the momentum on resume went unnoticed";
}

TEST_F(FaultTest, ExceptionInWorkerRestartsAndEndsBitIdentical) {
  const std::string want = reference();
  const RunResult r = run("raise", {"--max-restarts", "2"},
                          {"FAULT_RANK=0", "FAULT_STEP=5", "FAULT_KIND=raise"}, {"--sync"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_NE(r.err.find("rank 0 exited with code 1: std::runtime_error: injected failure at step 5; "
                       "restarting"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("restart 1 resumed at step 3\n"), std::string::npos) << r.out;
  EXPECT_EQ(params("raise"), want);
}

TEST_F(FaultTest, HungWorkerIsDetectedByHeartbeatAndRestarted) {
  const std::string want = reference();
  const RunResult r =
      run("hang",
          {"--max-restarts", "2", "--heartbeat-timeout", "2", "--monitor-interval", "0.1",
           "--log-dir", dir_ + "/logs"},
          {"FAULT_RANK=1", "FAULT_STEP=8", "FAULT_KIND=stop"}, {"--sync"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  // Rank 1 stopped; rank 0 then waits for it in the all-reduce: both go silent, the first seen
  // silent for over 2 s is named.
  EXPECT_NE(r.err.find("sent no heartbeat for"), std::string::npos) << r.err;
  // Rank 1 is not continued before SIGTERM (tandemrun reads its flight recorder's ring instead),
  // so neither rank gets past step 8 and the restart resumes from step 6's checkpoint, every
  // time. (Once continued, the ranks sometimes finished step 8 and saved step 9 before SIGTERM.)
  EXPECT_NE(r.out.find("restart 1 resumed at step 6\n"), std::string::npos) << r.out;
  std::set<std::string> dumps;  // <log dir>/<run id>_XXXXXX/flight/attempt_0/flight_rank<R>.json
  for (const auto& e : fs::recursive_directory_iterator(dir_ + "/logs")) {
    if (e.path().filename().string().rfind("flight_rank", 0) == 0)
      dumps.insert(e.path().parent_path().filename().string() + "/" + e.path().filename().string());
  }
  EXPECT_EQ(dumps,
            (std::set<std::string>{"attempt_0/flight_rank0.json", "attempt_0/flight_rank1.json"}))
      << "rank 0 dumps on SIGUSR1; tandemrun dumps the stopped rank 1 from its ring";
  EXPECT_NE(r.err.find("rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(
      r.err.find("is stopped (SIGSTOP or a debugger): tandemrun read its flight record itself"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(params("hang"), want);
}

TEST_F(FaultTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  const std::string want = reference();
  // Rank 1 hangs at step 10 (after the synchronous save of step 9); the test corrupts step 9's
  // shard while it hangs, then kills it: the restart must skip step 9 and resume from step 6.
  std::vector<std::string> args{"--nproc-per-node",
                                "2",
                                "--standalone",
                                "--grace-period-s",
                                "3",
                                "--max-restarts",
                                "2",
                                worker_path(),
                                "--ckpt",
                                dir_ + "/corrupt.ckpt",
                                "--out",
                                dir_ + "/corrupt.params",
                                "--steps",
                                std::to_string(kSteps),
                                "--every",
                                std::to_string(kEvery),
                                "--sync"};
  TandemrunProcess run(args, env_with({"FAULT_RANK=1", "FAULT_STEP=10", "FAULT_KIND=stop"}));
  ASSERT_TRUE(run.wait_for_stdout_count("fault stop at step 10 pid ", 1, 30s))
      << run.out() << run.err();
  std::smatch m;
  const std::string out = run.out();
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(fault stop at step 10 pid (\d+))")));
  const pid_t hung = static_cast<pid_t>(std::stol(m[1]));

  const std::string shard = dir_ + "/corrupt.ckpt/step_0000000009/rank_00000.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << shard << " missing; checkpoints: " << run.out();
  f.seekg(-1, std::ios::end);
  char last = 0;
  f.read(&last, 1);
  last = static_cast<char>(last ^ 0x5a);
  f.seekp(-1, std::ios::end);
  f.write(&last, 1);
  f.close();
  ::kill(hung, SIGKILL);

  const RunResult r = run.finish(40s);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_NE(r.err.find("step_0000000009"), std::string::npos) << "the skip names the checkpoint:\n"
                                                              << r.err;
  EXPECT_NE(r.out.find("restart 1 resumed at step 6\n"), std::string::npos) << r.out;
  EXPECT_EQ(params("corrupt"), want);
}

TEST_F(FaultTest, UnrecoverableFailureExhaustsRestartsAndNamesTheRootCause) {
  const RunResult r = run("always", {"--max-restarts", "1"},
                          {"FAULT_RANK=1", "FAULT_STEP=2", "FAULT_KIND=always-raise"}, {"--sync"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tandemrun: root cause (first failure): rank 1 on host "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restart 0: exited with code 1\ntandemrun:   error: std::runtime_error: "
                       "injected failure at step 2\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tandemrun: failures: 2 attempts (--max-restarts 1)"), std::string::npos)
      << r.err;
  EXPECT_EQ(count_occurrences(r.out, "done 12 steps"), 0u) << r.out;
}

TEST_F(FaultTest, FatalSignalIsRecordedInTheErrorFile) {
  const RunResult r = run("segv", {}, {"FAULT_RANK=0", "FAULT_STEP=1", "FAULT_KIND=segv"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("worker failed: rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("was killed by signal 11 (SIGSEGV)"), std::string::npos) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(tandemrun:   error: Signal 11 \(SIGSEGV\) received by PID \d+\n)")))
      << r.err;
}

TEST_F(FaultTest, RunMainWritesTorchElasticErrorFileForAnException) {
  const std::string path = dir_ + "/error.json";
  const RunResult r = TandemrunProcess({worker_path(), "--throw-now"},
                                       env_with({"TORCHELASTIC_ERROR_FILE=" + path}),
                                       /*through_tandemrun=*/false)
                          .finish(20s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("uncaught exception: std::runtime_error: thrown before init"),
            std::string::npos)
      << r.err;
  const std::string text = read_file(path);
  // TorchElastic's layout (torch/distributed/elastic/multiprocessing/errors/error_handler.py).
  EXPECT_TRUE(std::regex_search(
      text, std::regex(R"(^\{"message": \{"message": "std::runtime_error: thrown before init", )"
                       R"("extraInfo": \{"py_callstack": ".*", "timestamp": "\d+", )"
                       R"("kind": "exception", "restartable": true\}\}\}\n$)")))
      << text;
  const auto parsed = launch::parse_error_file(text);
  ASSERT_TRUE(parsed.has_value()) << text;
  EXPECT_EQ(parsed->message, "std::runtime_error: thrown before init");
  EXPECT_EQ(parsed->kind, launch::ErrorKind::kException);
  EXPECT_TRUE(parsed->restartable);
  EXPECT_NEAR(static_cast<double>(parsed->timestamp), static_cast<double>(std::time(nullptr)), 60);
}

// Issue 20 item 5: rank 1 is stopped (SIGSTOP); rank 0 then waits for it in the next all-reduce
// and stops beating too. The rank that went silent by itself is named, not the one waiting.
TEST_F(FaultTest, HungRankIsNamedRatherThanThePeerWaitingForIt) {
  const RunResult r =
      run("named", {"--heartbeat-timeout", "2", "--monitor-interval", "0.1"},
          {"FAULT_RANK=1", "FAULT_STEP=8", "FAULT_KIND=stop"}, {"--sync"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tandemrun: worker failed: rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(tandemrun: rank 1 [^\n]*sent no heartbeat)")))
      << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(root cause \(first failure\): rank 1 on host)")))
      << r.err;
}

// Issue 20 item 6: with rank 0 missing, rank 1 gives up on the store after TANDEM_TIMEOUT_S, not
// after twice that (waiting for the listener and the TCPStore client each took the whole timeout).
// Timed inside the worker (around tandem::init), so the program's start-up does not count.
TEST_F(FaultTest, StoreConnectTimeoutHonoursTheSetting) {
  std::vector<std::string> env = env_with({});
  for (auto& e : env) {
    if (e.rfind("TANDEM_TIMEOUT_S=", 0) == 0) e = "TANDEM_TIMEOUT_S=3";
  }
  // Port 1 on loopback: privileged, and no store listens there.
  env.insert(env.end(), {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                         "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"});
  const RunResult r =
      TandemrunProcess({worker_path(), "--time-init"}, env, /*through_tandemrun=*/false)
          .finish(30s);
  ASSERT_FALSE(r.timed_out) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(init failed after ([0-9.]+) s)")))
      << r.out << r.err;
  const double seconds = std::stod(m[1]);
  EXPECT_GE(seconds, 2.9) << r.out;
  EXPECT_LT(seconds, 4.5) << "TANDEM_TIMEOUT_S=3 must bound the whole connect\n" << r.out;
  EXPECT_NE(r.out.find("within 3000 ms"), std::string::npos) << r.out;
}

// Issue 20 item 14: a restart is taken over from standby workers by default (--max-restarts > 0,
// a program that calls tandem::run_main); --no-standby turns it off.
TEST_F(FaultTest, RestartUsesStandbyWorkersByDefault) {
  const std::string want = reference();
  const RunResult r =
      run("default", {"--max-restarts", "2"}, {"FAULT_RANK=1", "FAULT_STEP=7", "FAULT_KIND=kill"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_NE(r.err.find("restart 1: 2 of 2 workers taken over from standby processes"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(params("default"), want) << "resumed run differs from the uninterrupted one";
}

TEST_F(FaultTest, NoStandbyStartsTheRestartedWorkersAfresh) {
  const RunResult r = run("fresh", {"--max-restarts", "2", "--no-standby"},
                          {"FAULT_RANK=1", "FAULT_STEP=7", "FAULT_KIND=kill"});
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  expect_restarted_once_and_resumed(r);
  EXPECT_EQ(r.err.find("standby"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem::launcher_test
