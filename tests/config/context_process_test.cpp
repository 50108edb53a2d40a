// tandem::run_main(argc, argv, fn(Context&)) in real processes: flags taken out of argv, config
// errors exit 2 with the message on stderr and in the error file, --print-config/--help-config
// stop before fn, and under tandemrun two ranks connect with the merged config.
#include "tests/launcher/tandemrun_process.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tandem::launcher_test {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/tandem-context-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

RunResult run_worker(std::vector<std::string> args, std::vector<std::string> env = clean_env()) {
  args.insert(args.begin(), worker_path());
  TandemrunProcess p(args, env, /*through_tandemrun=*/false);
  return p.finish(20s);
}

TEST(ContextProcess, ConfigErrorExitsTwoWithTheMessageOnStderrAndInTheErrorFile) {
  const std::string dir = temp_dir();
  const std::string yaml = dir + "/bad.yaml";
  std::ofstream(yaml) << "ddp:\n  bucket_cap: 10\n";
  auto env = clean_env();
  env.push_back("TORCHELASTIC_ERROR_FILE=" + dir + "/error.json");
  const RunResult r = run_worker({"--config", yaml, "--set", "train.steps=-1"}, env);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out.find("worker rank="), std::string::npos) << "fn must not run";
  const std::string first = yaml + ":2:3: unknown key 'ddp.bucket_cap' (value '10'); did you mean 'ddp.bucket_cap_mb'?";
  EXPECT_NE(r.err.find("tandem::run_main: configuration error: tandem::InvalidConfigError: tandem: invalid "
                       "configuration (2 problems):\n  " + first),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--set train.steps=-1: train.steps must be >= 0, got '-1' (default 100)."),
            std::string::npos) << r.err;
  const std::string json = read_file(dir + "/error.json");
  EXPECT_NE(json.find("\"message\": \"tandem::InvalidConfigError: tandem: invalid configuration (2 problems):\\n  " +
                      first),
            std::string::npos)
      << json;
  std::remove(yaml.c_str());
  std::remove((dir + "/error.json").c_str());
  ::rmdir(dir.c_str());
}

// Under a launcher, tandem::run_main holds back the report of a lost peer (PeerLostError) so
// that the peer, which failed first, is named as the root cause; a CommError of bad input has no
// such peer and is reported at once.
TEST(ContextProcess, ACommErrorOfBadInputIsReportedWithoutTheLostPeerDelay) {
  const std::string dir = temp_dir();
  auto env = clean_env();
  env.push_back("CONFIG_TEST_BAD_INPUT=1");
  const auto timed = [&](std::vector<std::string> extra_env) {
    auto e = env;
    e.insert(e.end(), extra_env.begin(), extra_env.end());
    const auto start = std::chrono::steady_clock::now();
    const RunResult r = run_worker({}, e);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("tandem::CommError: tandem: allreduce: 'avg' on an integer tensor"),
              std::string::npos)
        << r.err;
    return seconds;
  };
  const double without_launcher = timed({});
  const double with_launcher = timed({"TORCHELASTIC_ERROR_FILE=" + dir + "/error.json"});
  // The lost-peer delay is 2 s; process start-up varies by a fraction of that.
  EXPECT_LT(with_launcher - without_launcher, 1.0)
      << "with an error file " << with_launcher << " s, without " << without_launcher << " s";
  std::remove((dir + "/error.json").c_str());
  ::rmdir(dir.c_str());
}

TEST(ContextProcess, PrintConfigShowsEffectiveValuesWithSourcesAndStops) {
  auto env = clean_env();
  env.push_back("TANDEM_TRAIN_STEPS=9");
  const RunResult r = run_worker({"--print-config", "--set", "ddp.bucket_cap_mb=10"}, env);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ddp:\n  bucket_cap_mb: 10  # --set\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  steps: 9  # TANDEM_TRAIN_STEPS\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  first_bucket_cap_mb: 1  # default\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("worker rank="), std::string::npos) << "fn must not run";

  const RunResult help = run_worker({"--help-config"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("ddp.bucket_cap_mb = 25\n    float, > 0; env TANDEM_DDP_BUCKET_CAP_MB\n"),
            std::string::npos)
      << help.out;
}

TEST(ContextProcess, TwoRanksUnderTandemrunGetTheMergedConfigAndTheirOwnArguments) {
  const std::string dir = temp_dir();
  const std::string yaml = dir + "/train.yaml";
  std::ofstream(yaml) << "ddp: {bucket_cap_mb: 5}\ntrain: {steps: 3}\ncompression: {codec: topk}\n";
  auto env = clean_env();
  env.push_back("TANDEM_TRAIN_STEPS=4");  // env over the file
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", "--standalone", worker_path(), "--config", yaml,
                                     "input.txt", "--set", "ddp.bucket_cap_mb=7", "--verbose"},
                                    env, 60s);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line = "[rank " + std::to_string(rank) + "]: worker rank=" + std::to_string(rank) +
                             "/2 sum=3 bucket_cap_mb=7 steps=4 codec=topk from=--set args=[input.txt --verbose]";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out << r.err;
    // Context's launcher facts (issue 19).
    const std::string local = "[rank " + std::to_string(rank) + "]: worker local=" + std::to_string(rank) + "/2 restarts=0";
    EXPECT_NE(r.out.find(local), std::string::npos) << r.out;
  }
  std::remove(yaml.c_str());
  ::rmdir(dir.c_str());
}

TEST(TandemConfigTool, DefaultsPrintCheck) {
  TandemrunProcess md({TANDEM_CONFIG_PATH, "defaults", "--markdown", "--section", "ddp"}, clean_env(), false);
  const RunResult m = md.finish(20s);
  EXPECT_EQ(m.exit_code, 0) << m.err;
  EXPECT_EQ(m.out.rfind("### `ddp`\n\n| key | type | default | allowed | environment | doc |\n|---|", 0), 0u) << m.out;
  EXPECT_NE(m.out.find("| `ddp.bucket_cap_mb` | float | `25` | > 0 | `TANDEM_DDP_BUCKET_CAP_MB` | "),
            std::string::npos) << m.out;
  EXPECT_EQ(m.out.find("pipeline."), std::string::npos) << "only the ddp section";

  TandemrunProcess bad({TANDEM_CONFIG_PATH, "check", "--set", "ddp.bucket_cap_mb=x"}, clean_env(), false);
  const RunResult b = bad.finish(20s);
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_EQ(b.err, "tandem: invalid configuration (1 problem):\n  --set ddp.bucket_cap_mb=x: ddp.bucket_cap_mb "
                   "expects a float (> 0), got 'x' (default 25).\n");

  TandemrunProcess good({TANDEM_CONFIG_PATH, "print", "--set", "pipeline.schedule=gpipe"}, clean_env(), false);
  const RunResult g = good.finish(20s);
  EXPECT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.out.find("pipeline:\n  schedule: gpipe  # --set\n"), std::string::npos) << g.out;
}

}  // namespace
}  // namespace tandem::launcher_test
