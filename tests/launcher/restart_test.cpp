// --max-restarts, error files and heartbeats: the group is stopped and started again after a
// failure; when no restart is left the summary names the first failure and its error message.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "tests/launcher/tandemrun_process.h"
#include "base/launch_contract.h"
#include "tools/tandemrun/supervise/root_cause.h"

namespace tandem::launcher_test {
namespace {

// (restart count, rank) -> KEY -> VALUE, from the `env` lines workers print on every attempt.
using AttemptEnv = std::map<std::pair<int, int>, std::map<std::string, std::string>>;

AttemptEnv parse_attempt_env(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> current;  // rank -> env being read
  AttemptEnv envs;
  static const std::regex kLine(R"(^\[rank (\d+)\]: ([A-Z_]+)=(.*)$)");
  for (const auto& line : split_lines(out)) {
    std::smatch m;
    if (!std::regex_match(line, m, kLine)) continue;
    const int rank = std::stoi(m[1]);
    current[rank][m[2]] = m[3];
    if (m[2] == "TANDEM_TEST_MARKER") {  // the last key printed: one attempt's env is complete
      const int restart = std::stoi(current[rank].at("TORCHELASTIC_RESTART_COUNT"));
      envs[{restart, rank}] = current[rank];
      current[rank].clear();
    }
  }
  return envs;
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

TEST(RestartTest, FailedWorkerRestartsTheGroupWhichThenSucceeds) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", "--max-restarts", "2", "--standalone",
                                     worker_path(), "fail-once", "1", "3"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("rank 1 exited with code 3; restarting all workers (restart 1 of at most "
                       "2)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("all workers exited 0 after 1 restart\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("worker failed:"), std::string::npos) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "restart 1 done"), 2u) << r.out;
  EXPECT_EQ(count_occurrences(r.out, "restart 2 done"), 0u) << r.out;

  const AttemptEnv envs = parse_attempt_env(r.out);
  ASSERT_EQ(envs.size(), 4u) << r.out;
  std::set<std::string> error_files;
  for (const auto& [key, env] : envs) {
    const auto [restart, rank] = key;
    SCOPED_TRACE("restart " + std::to_string(restart) + " rank " + std::to_string(rank));
    EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), std::to_string(restart));
    EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "2");
    EXPECT_EQ(env.at("RANK"), std::to_string(rank));
    EXPECT_NE(env.at("TORCHELASTIC_ERROR_FILE"), "<unset>");
    EXPECT_EQ(env.at("TANDEM_HEARTBEAT_FILE"), "<unset>");  // no --heartbeat-timeout
    error_files.insert(env.at("TORCHELASTIC_ERROR_FILE"));
    // Same run id on every attempt: the store prefix tandem/<run_id>/restart<N> tells them apart.
    EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), envs.begin()->second.at("TORCHELASTIC_RUN_ID"));
  }
  EXPECT_EQ(error_files.size(), 4u) << "one error file per worker and attempt";
  // The per-run directory of error files is removed at the end.
  EXPECT_NE(::access(envs.begin()->second.at("TORCHELASTIC_ERROR_FILE").c_str(), F_OK), 0);
}

TEST(RestartTest, GivingUpNamesTheFirstFailureWithItsErrorFileMessage) {
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "2", "--max-restarts", "2", "--grace-period-s", "2",
                     worker_path(), "error-file", "1", "7", "bad batch"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(count_occurrences(r.err, "; restarting all workers (restart "), 2u) << r.err;
  EXPECT_NE(r.err.find("rank 1 exited with code 7: ValueError: bad batch at restart 1; restarting "
                       "all workers (restart 2 of at most 2)"),
            std::string::npos)
      << r.err;
  // The last attempt's summary, as without restarts.
  EXPECT_NE(r.err.find("tandemrun: worker failed: rank 1 (pid "), std::string::npos) << r.err;
  // The root cause is the FIRST failure (restart 0), with host, exit code and message.
  EXPECT_NE(
      r.err.find("tandemrun: root cause (first failure): rank 1 on host " + host_name() + " (pid "),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("), restart 0: exited with code 7\ntandemrun:   error: ValueError: bad "
                       "batch at restart 0\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tandemrun: failures: 3 attempts (--max-restarts 2)\n"), std::string::npos)
      << r.err;
  for (int restart = 0; restart <= 2; ++restart) {
    EXPECT_NE(r.err.find("tandemrun:   restart " + std::to_string(restart) + ": rank 1 (pid "),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("exited with code 7: ValueError: bad batch at restart " +
                         std::to_string(restart) + "\n"),
              std::string::npos)
        << r.err;
  }
}

TEST(RestartTest, WithoutRestartsTheErrorFileMessageIsShown) {
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "2", worker_path(), "error-file", "0", "5", "oops"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tandemrun: worker failed: rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tandemrun:   error: ValueError: oops at restart 0\n"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("restarting all workers"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tandemrun: failures:"), std::string::npos) << r.err;
}

TEST(RestartTest, ACommunicationErrorIsNotTakenForTheRootCause) {
  // Rank 2 exits first with a CommError (its peer went away); rank 0, the real cause, exits later.
  const RunResult r = run_tandemrun({"--nproc-per-node", "3", worker_path(), "cascade", "0", "2"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tandemrun: rank 2 exited with code 1; stopping the other workers"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tandemrun: worker failed: rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("root cause (first failure): rank 0 on host"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3\ntandemrun:   error: ValueError: the real cause\n"),
            std::string::npos)
      << r.err;
  // Rank 1 was not failing: it was stopped after the settle, with SIGTERM.
  EXPECT_NE(r.err.find("was killed by signal 15 (SIGTERM) after tandemrun sent SIGTERM"),
            std::string::npos)
      << r.err;
}

TEST(RestartTest, HungWorkerIsFailedByTheHeartbeatTimeoutAndRestarted) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", "--max-restarts", "1",
                                     "--heartbeat-timeout", "1", "--monitor-interval", "0.05",
                                     "--grace-period-s", "2", worker_path(), "heartbeat", "1"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(count_occurrences(r.out, "[rank 1]: stopping myself"), 1u) << r.out;
  EXPECT_NE(r.err.find("rank 1 sent no heartbeat for 1 s (--heartbeat-timeout 1 s): hung; "
                       "restarting all workers (restart 1 of at most 1)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_occurrences(r.out, "finished restart 1"), 2u) << r.out;
  EXPECT_EQ(count_occurrences(r.out, "finished restart 0"), 0u) << r.out;
  // Detected after ~1 s of silence, stopped at once (SIGTERM + SIGCONT), not after the grace.
  EXPECT_LT(r.seconds, 8.0) << r.err;
}

TEST(RestartTest, HungWorkerWithoutRestartsFailsTheRunAndIsNamed) {
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "2", "--heartbeat-timeout", "1", "--monitor-interval",
                     "0.05", worker_path(), "heartbeat", "0"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("tandemrun: worker failed: rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sent no heartbeat for 1 s (hung; over the --heartbeat-timeout) and was "
                       "killed by signal 15 (SIGTERM) after tandemrun sent SIGTERM"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("root cause (first failure): rank 0 on host"), std::string::npos) << r.err;
}

TEST(RestartTest, WorkerThatNeverBeatsIsNotTimedOut) {
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "2", "--heartbeat-timeout", "0.3", "--monitor-interval",
                     "0.05", worker_path(), "no-heartbeat", "1200"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_occurrences(r.out, "]: done"), 2u) << r.out;
}

TEST(RestartTest, SigtermDuringARestartedRunStillStopsEverything) {
  TandemrunProcess run(
      {"--nproc-per-node", "2", "--max-restarts", "3", worker_path(), "error-file", "1", "3", "x"});
  // Wait until the group has been restarted at least once, then stop tandemrun.
  ASSERT_TRUE(run.read_until(
      [&] { return run.err().find("restarting all workers (restart 1") != std::string::npos; },
      10s))
      << run.err();
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 2)) << run.out() << run.err();
  run.send(SIGTERM);
  const RunResult r = run.finish(15s);
  ASSERT_FALSE(r.timed_out);
  // Either stopped by the signal (143), or the signal arrived after rank 1 of the last attempt had
  // already failed and no restart was left (1); never a hang or a leftover worker.
  EXPECT_TRUE(r.exit_code == 143 || r.exit_code == 1) << r.exit_code << "\n" << r.err;
  for (const auto& [rank, pid] : ready_pids(r.out)) {
    EXPECT_TRUE(wait_until_gone(pid, 2s)) << "rank " << rank << " (pid " << pid << ") still runs";
  }
}

TEST(RestartTest, StopSignalWhileStoppingAFailedGroupPreventsTheRestart) {
  std::vector<std::string> env = clean_env();
  env.push_back("TEST_IGNORE_TERM=1");
  TandemrunProcess run({"--nproc-per-node", "2", "--max-restarts", "3", "--grace-period-s", "10",
                        worker_path(), "fail-rank", "1", "3", "100"},
                       env);
  ASSERT_TRUE(run.read_until(
      [&] { return run.err().find("stopping the other workers") != std::string::npos; }, 10s))
      << run.err();
  run.send(SIGTERM);  // rank 0 ignores SIGTERM: tandemrun is inside the 10 s grace period
  const RunResult r = run.finish(15s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_LT(r.seconds, 8.0) << "the second signal cuts the grace period short\n" << r.err;
  EXPECT_EQ(r.err.find("restarting all workers"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM while handling the failure; not restarting"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("root cause (first failure): rank 1 on host"), std::string::npos) << r.err;
  for (const auto& [rank, pid] : ready_pids(r.out)) {
    EXPECT_TRUE(wait_until_gone(pid, 2s)) << "rank " << rank << " (pid " << pid << ") still runs";
  }
}

TEST(RestartTest, SigkillOfTandemrunDuringARestartLeavesNoWorkerBehind) {
  // Orphaned workers are re-parented to us (not to init), so we can see and reap them.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // Its per-run directory (error files) cannot be removed by a SIGKILLed tandemrun: keep it here.
  char tmp[] = "/tmp/tandemrun_test_XXXXXX";
  ASSERT_NE(::mkdtemp(tmp), nullptr);
  std::vector<std::string> env = clean_env();
  env.push_back(std::string("TMPDIR=") + tmp);
  TandemrunProcess run({"--nproc-per-node", "3", "--max-restarts", "50", worker_path(),
                        "error-file", "2", "4", "again"},
                       env);
  // Ranks 0 and 1 of three attempts have started (rank 2 fails on every attempt).
  ASSERT_TRUE(run.wait_for_stdout_count("ready pid=", 6)) << run.out() << run.err();
  run.send(SIGKILL);
  const RunResult r = run.finish(10s);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.term_signal, SIGKILL);
  const auto pids = ready_pids(r.out);  // ranks 0 and 1 of the last attempt that printed
  ASSERT_EQ(pids.size(), 2u) << r.out;
  std::size_t checked = 0;
  for (const auto& line : split_lines(r.out)) {
    const auto at = line.find("ready pid=");
    if (at == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(line.substr(at + 10)));
    EXPECT_TRUE(wait_until_gone(pid, 5s)) << line << ": survived its launcher";
    ++checked;
  }
  EXPECT_GE(checked, 6u) << "workers of at least three attempts";
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  std::error_code ignored;
  std::filesystem::remove_all(tmp, ignored);
}

// parse_error_file(), the reader of TorchElastic's error-file format.
TEST(ErrorFileTest, ParsesTorchElasticFormatWithEscapes) {
  const auto e = launch::parse_error_file(
      R"({"message": {"message": "RuntimeError: a \"quoted\" \\ path\nline2 \u00e9\ud83d\ude00",)"
      R"( "extraInfo": {"py_callstack": "Traceback\n  x", "timestamp": "1700000000"}}})");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message, "RuntimeError: a \"quoted\" \\ path\nline2 \xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(e->callstack, "Traceback\n  x");
  EXPECT_EQ(e->timestamp, 1700000000);
  // A Python worker's file has no kind: an ordinary failure that a restart may fix.
  EXPECT_EQ(e->kind, launch::ErrorKind::kException);
  EXPECT_TRUE(e->restartable);
}

// The launch contract's own fields round-trip, and tandemrun decides from them alone.
TEST(ErrorFileTest, KindAndRestartableRoundTripAndDecideTheRestart) {
  launch::ErrorReport report;
  report.message = "app::ModelVersionError: weights of format 3, this build reads 2";
  report.callstack = "C++ exception\n";
  report.timestamp = 1700000000;
  report.kind = launch::ErrorKind::kError;
  report.restartable = false;
  const auto back = launch::parse_error_file(launch::error_file_json(report));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->message, report.message);
  EXPECT_EQ(back->callstack, report.callstack);
  EXPECT_EQ(back->timestamp, report.timestamp);
  EXPECT_EQ(back->kind, launch::ErrorKind::kError);
  EXPECT_FALSE(back->restartable);
  EXPECT_NE(launcher::final_reason(std::nullopt, back), "");
  // The words tandemrun once matched mean nothing without the fields.
  report.message = "tandem::CheckpointError: tandem: checkpoint: cannot resume: Permission denied";
  report.kind = launch::ErrorKind::kCheckpoint;
  report.restartable = true;
  EXPECT_EQ(launcher::final_reason(std::nullopt, report), "");
  // Every kind reads back as itself, and a final one of each is named as final.
  for (auto kind : {launch::ErrorKind::kError, launch::ErrorKind::kConfig, launch::ErrorKind::kComm,
                    launch::ErrorKind::kTimeout, launch::ErrorKind::kPeerLost,
                    launch::ErrorKind::kCheckpoint, launch::ErrorKind::kFile,
                    launch::ErrorKind::kOutOfMemory, launch::ErrorKind::kSignal}) {
    report.kind = kind;
    report.restartable = false;
    const auto read = launch::parse_error_file(launch::error_file_json(report));
    ASSERT_TRUE(read.has_value());
    EXPECT_EQ(read->kind, kind) << launch::kind_name(kind);
    EXPECT_NE(launcher::final_reason(std::nullopt, read), "") << launch::kind_name(kind);
  }
  report.restartable = true;
  // A communication kind is a consequence, whatever the message says.
  report.kind = launch::ErrorKind::kPeerLost;
  EXPECT_TRUE(launcher::looks_secondary(report));
  report.kind = launch::ErrorKind::kError;
  report.message = "tandem::CommError: looks like one";
  EXPECT_FALSE(launcher::looks_secondary(report));
}

TEST(ErrorFileTest, ParsesTheFlatFormAndRejectsGarbage) {
  const auto flat =
      launch::parse_error_file(R"({"message": "boom", "timestamp": 12, "x": [1, {"a": null}]})");
  ASSERT_TRUE(flat.has_value());
  EXPECT_EQ(flat->message, "boom");
  EXPECT_EQ(flat->timestamp, 12);
  EXPECT_FALSE(launch::parse_error_file("").has_value());
  EXPECT_FALSE(launch::parse_error_file("{\"message\": {\"message\": \"cut").has_value());
  EXPECT_FALSE(launch::parse_error_file("{\"other\": 1}").has_value());
  EXPECT_FALSE(launch::parse_error_file("{\"message\": 1}").has_value());
  EXPECT_FALSE(launch::parse_error_file("{} trailing").has_value());
  EXPECT_FALSE(launch::read_error_file("/nonexistent/tandem/error.json").has_value());
}

}  // namespace
}  // namespace tandem::launcher_test
