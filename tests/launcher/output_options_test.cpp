// --log-dir, --redirects, --tee and --local-ranks-filter (torchrun's semantics, log_files.h):
// which stream reaches the console, which lands in <log_dir>/<run_id>_XXXXXX/attempt_N/<local
// rank>/{stdout,stderr}.log, and that error files follow the log directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

namespace fs = std::filesystem;

// A fresh directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/tandemrun_logs_test_XXXXXX";
    if (::mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The one run directory under `base` (<run_id>_XXXXXX); fails the test when there is not one.
fs::path run_dir(const std::string& base, const std::string& run_id) {
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(base)) dirs.push_back(entry.path());
  EXPECT_EQ(dirs.size(), 1u) << "one run directory expected under " << base;
  if (dirs.empty()) return fs::path(base) / "missing";
  EXPECT_EQ(dirs[0].filename().string().rfind(run_id + "_", 0), 0u) << dirs[0];
  return dirs[0];
}

// What the test worker's `print` mode writes on each stream, byte for byte.
std::string printed_out(int rank) {
  return "out line 1\nout line 2\n\n" + std::string(10000, 'x') + "\npartial-out-" +
         std::to_string(rank);
}
std::string printed_err(int rank) { return "err line 1\npartial-err-" + std::to_string(rank); }

bool has_worker_line(const std::string& text, int rank) {
  return text.find("[rank " + std::to_string(rank) + "]: ") != std::string::npos;
}

TEST(OutputOptionsTest, RedirectAllSendsBothStreamsToFilesOnly) {
  TempDir logs;
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", "--log-dir", logs.path(),
                                     "--redirects", "3", "--run-id", "job1", worker_path(),
                                     "print"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has_worker_line(r.out, 0) || has_worker_line(r.out, 1)) << r.out;
  EXPECT_FALSE(has_worker_line(r.err, 0) || has_worker_line(r.err, 1)) << r.err;
  const fs::path attempt = run_dir(logs.path(), "job1") / "attempt_0";
  EXPECT_NE(r.err.find("worker log files under " + attempt.parent_path().string()),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const fs::path dir = attempt / std::to_string(rank);
    EXPECT_EQ(read_file(dir / "stdout.log"), printed_out(rank)) << "files hold the raw bytes";
    EXPECT_EQ(read_file(dir / "stderr.log"), printed_err(rank));
  }
}

TEST(OutputOptionsTest, PerRankTeeMapWritesFilesAndKeepsTheConsole) {
  TempDir logs;
  // Underscore spellings, like torchrun's.
  const RunResult r = run_tandemrun({"--nproc_per_node", "2", "--log_dir", logs.path(), "--tee",
                                     "0:1,1:2", "--run_id", "job2", worker_path(), "print"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path attempt = run_dir(logs.path(), "job2") / "attempt_0";
  // Tee'd streams are in a file and on the console.
  EXPECT_EQ(read_file(attempt / "0" / "stdout.log"), printed_out(0));
  EXPECT_EQ(read_file(attempt / "1" / "stderr.log"), printed_err(1));
  EXPECT_NE(r.out.find("[rank 0]: out line 1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[rank 1]: err line 1\n"), std::string::npos) << r.err;
  // The others only on the console.
  EXPECT_FALSE(fs::exists(attempt / "0" / "stderr.log"));
  EXPECT_FALSE(fs::exists(attempt / "1" / "stdout.log"));
  EXPECT_NE(r.err.find("[rank 0]: err line 1\n"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[rank 1]: out line 1\n"), std::string::npos) << r.out;
}

TEST(OutputOptionsTest, LocalRanksFilterHidesOtherRanksButKeepsTheirFiles) {
  TempDir logs;
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "3", "--local-ranks-filter", "1", "--log-dir",
                     logs.path(), "--tee", "3", "--run-id", "job3", worker_path(), "print"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 1]: out line 1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[rank 1]: err line 1\n"), std::string::npos) << r.err;
  for (int hidden : {0, 2}) {
    EXPECT_FALSE(has_worker_line(r.out, hidden)) << r.out;
    EXPECT_FALSE(has_worker_line(r.err, hidden)) << r.err;
  }
  const fs::path attempt = run_dir(logs.path(), "job3") / "attempt_0";
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(read_file(attempt / std::to_string(rank) / "stdout.log"), printed_out(rank));
}

TEST(OutputOptionsTest, FilterWithoutFilesNeedsNoLogDirectory) {
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "2", "--local_ranks_filter", "0", worker_path(), "print"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has_worker_line(r.out, 0));
  EXPECT_FALSE(has_worker_line(r.out, 1)) << r.out;
  EXPECT_EQ(r.err.find("worker log files under"), std::string::npos) << r.err;
}

TEST(OutputOptionsTest, ErrorFilesAndRestartsUseOneAttemptDirectoryEach) {
  TempDir logs;
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                                     logs.path(), "--run-id", "job4", worker_path(), "error-file",
                                     "1", "3", "bad input"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 1) << r.err;
  const fs::path run = run_dir(logs.path(), "job4");
  for (int attempt = 0; attempt < 2; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const fs::path error = run / ("attempt_" + std::to_string(attempt)) / "1" / "error.json";
    ASSERT_TRUE(fs::exists(error)) << "TORCHELASTIC_ERROR_FILE: <attempt>/<local rank>/error.json";
    EXPECT_NE(read_file(error).find("bad input at restart " + std::to_string(attempt)),
              std::string::npos);
  }
  // The summary still reads it from there.
  EXPECT_NE(r.err.find("ValueError: bad input at restart 1"), std::string::npos) << r.err;
}

TEST(OutputOptionsTest, PetVariablesSetTheOptions) {
  TempDir logs;
  std::vector<std::string> env = clean_env();
  env.push_back("PET_LOG_DIR=" + logs.path());
  env.push_back("PET_REDIRECTS=1");
  env.push_back("PET_RUN_ID=job5");
  env.push_back("PET_LOCAL_RANKS_FILTER=0");
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", worker_path(), "print"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path attempt = run_dir(logs.path(), "job5") / "attempt_0";
  EXPECT_EQ(read_file(attempt / "1" / "stdout.log"), printed_out(1));
  EXPECT_FALSE(fs::exists(attempt / "1" / "stderr.log"));
  EXPECT_FALSE(has_worker_line(r.out, 0)) << "stdout is redirected: " << r.out;
  EXPECT_NE(r.err.find("[rank 0]: err line 1\n"), std::string::npos) << r.err;
  EXPECT_FALSE(has_worker_line(r.err, 1)) << "rank 1 is filtered out: " << r.err;
}

TEST(OutputOptionsTest, HelpDocumentsEachOptionAndItsPetVariable) {
  const RunResult r = run_tandemrun({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* text :
       {"--log-dir,--log_dir", "PET_LOG_DIR", "-r,--redirects", "PET_REDIRECTS", "-t,--tee",
        "PET_TEE", "--local-ranks-filter,--local_ranks_filter", "PET_LOCAL_RANKS_FILTER",
        "PET_GRACE_PERIOD_S", "PET_HEARTBEAT_TIMEOUT", "SLURM_GPUS_ON_NODE"})
    EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing from --help:\n" << r.out;
}

TEST(OutputOptionsTest, BadValuesAreRejectedBeforeAnythingStarts) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--redirects", "4"}, "--redirects '4' is not a stream choice"},
      {{"--tee", "0:1,0:2"}, "names local rank 0 twice"},
      {{"--tee", "0=1"}, "--tee '0=1' is not a stream choice"},
      {{"--local-ranks-filter", "2"}, "names local rank 2 but only 2 workers run per node"},
      {{"--local-ranks-filter", "a"}, "must be a comma-separated list of local ranks"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"--nproc-per-node", "2"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    args.insert(args.end(), {worker_path(), "print"});
    const RunResult r = run_tandemrun(args);
    EXPECT_EQ(r.exit_code, 2) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace tandem::launcher_test
