// ProgressLogger: the progress line and the JSON-lines file, with an injected clock.
#include <gtest/gtest.h>
#include <tandem/base/errors.h>
#include <tandem/runtime/metrics.h>

#include "base/json.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tandem {
namespace {

class MetricsTest : public ::testing::Test {
 protected:
  MetricsTest() {
    char tmpl[] = "/tmp/tandem-metrics-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    sources_.clock = [this] { return now_; };
    sources_.peak_bytes = [] { return int64_t{212} << 20; };
    sources_.reduction = []() -> std::optional<ReductionTimes> { return ReductionTimes{0.75, 0.25}; };
  }
  ~MetricsTest() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::vector<std::string> file_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::string dir_;
  double now_ = 100.0;
  ProgressSources sources_;
};

TEST_F(MetricsTest, LineAndJsonEveryNStepsWithGlobalRateAndEta) {
  MetricsOptions options;
  options.log_every = 2;
  options.file = dir_ + "/metrics.jsonl";
  std::ostringstream out;
  ProgressLogger logger(options, 10, /*rank=*/0, /*world=*/2, sources_, &out);
  now_ = 101;
  EXPECT_FALSE(logger.step(1, 0.5, 8));
  now_ = 102;
  const auto r = logger.step(2, 0.4312, 8);
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->samples_per_s, 16.0);  // 2 steps x 8 samples x 2 ranks in 2 s
  EXPECT_DOUBLE_EQ(*r->eta_s, 8.0);          // 1 s per step, 8 steps left
  now_ = 107;
  logger.step(3, 0.3, 8);
  now_ = 112;
  logger.step(4, 0.2, 8);  // 32 samples in 10 s; 5 s per step, 6 left
  EXPECT_EQ(out.str(),
            "step 2/10 loss 0.4312 16 samples/s ETA 8s peak 212 MiB hidden 75%\n"
            "step 4/10 loss 0.2000 3 samples/s ETA 30s peak 212 MiB hidden 75%\n");
  const auto lines = file_lines(options.file);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "{\"step\":2,\"total_steps\":10,\"loss\":0.4312,\"samples_per_s\":16,\"elapsed_s\":2,"
            "\"eta_s\":8,\"peak_bytes\":222298112,\"hidden\":0.75}");
  const JsonValue second = parse_json(lines[1], JsonErrors::kPlain);
  EXPECT_EQ(second.at("step", "s").as_int("s"), 4);
  EXPECT_DOUBLE_EQ(second.at("samples_per_s", "r").as_double("r"), 3.2);
  EXPECT_DOUBLE_EQ(second.at("elapsed_s", "e").as_double("e"), 12);
}

// A line's "hidden" covers every step since the previous line, not the last step alone: steps
// that alternate between reductions hidden under backward and reductions waited for after it
// give one share, not 100% on one line and 0% on the next.
TEST_F(MetricsTest, OverlapIsTheHiddenShareOfEveryReductionSinceTheLastLine) {
  MetricsOptions options;
  options.log_every = 2;
  std::ostringstream out;
  int64_t n = 0;
  sources_.reduction = [&n]() -> std::optional<ReductionTimes> {
    return ++n % 2 == 1 ? ReductionTimes{0.375, 0.125} : ReductionTimes{0.0, 0.5};
  };
  ProgressLogger logger(options, 4, 0, 1, sources_, &out);
  for (int64_t s = 1; s <= 4; ++s) {
    now_ += 1;
    const auto r = logger.step(s, 1.0, 4);
    if (s % 2 == 0) {
      ASSERT_TRUE(r && r->hidden);
      EXPECT_DOUBLE_EQ(*r->hidden, 0.375) << "step " << s;  // 0.375 of 1.0 s
    }
  }
  EXPECT_NE(out.str().find("step 4/4 loss 1.0000 4 samples/s ETA 0s peak 212 MiB hidden 38%"),
            std::string::npos)
      << out.str();
}

TEST_F(MetricsTest, LastStepIsLoggedAndUnknownTotalHasNoEta) {
  MetricsOptions options;
  options.log_every = 2;
  std::ostringstream out;
  sources_.reduction = nullptr;
  {
    ProgressLogger logger(options, 3, 0, 1, sources_, &out);
    for (int64_t s = 1; s <= 3; ++s) {
      now_ += 1;
      logger.step(s, 1.0, 4);
    }
  }
  EXPECT_EQ(out.str(),
            "step 2/3 loss 1.0000 4 samples/s ETA 1s peak 212 MiB\n"
            "step 3/3 loss 1.0000 4 samples/s ETA 0s peak 212 MiB\n");
  std::ostringstream open_ended;
  ProgressLogger logger(options, 0, 0, 1, sources_, &open_ended);
  now_ += 1;
  logger.step(1, 2.0, 4);
  now_ += 1;
  logger.step(2, 2.0, 4);
  EXPECT_EQ(open_ended.str(), "step 2 loss 2.0000 4 samples/s peak 212 MiB\n");
}

TEST_F(MetricsTest, OtherRanksAndLogEveryZeroAreSilent) {
  MetricsOptions options;
  options.log_every = 1;
  options.file = dir_ + "/rank1.jsonl";
  std::ostringstream out;
  ProgressLogger other_rank(options, 10, 1, 2, sources_, &out);
  EXPECT_FALSE(other_rank.step(1, 0.1, 1));
  EXPECT_FALSE(std::ifstream(options.file).good());  // only rank 0 writes the file
  options.log_every = 0;
  options.file.clear();
  ProgressLogger off(options, 10, 0, 2, sources_, &out);
  EXPECT_FALSE(off.step(1, 0.1, 1));
  EXPECT_EQ(out.str(), "");
}

TEST_F(MetricsTest, DefaultPeakMemoryIsPositive) {
  MetricsOptions options;
  options.log_every = 1;
  ProgressSources real;  // steady clock, allocator peak or max RSS
  std::ostringstream out;
  ProgressLogger logger(options, 1, 0, 1, real, &out);
  const auto r = logger.step(1, 0.0, 1);
  ASSERT_TRUE(r);
  EXPECT_GT(r->peak_bytes, 0);
  EXPECT_FALSE(r->hidden);
}

TEST_F(MetricsTest, DurationsAndBadOptions) {
  EXPECT_EQ(ProgressLogger::format_duration(45.2), "45s");
  EXPECT_EQ(ProgressLogger::format_duration(151), "2m31s");
  EXPECT_EQ(ProgressLogger::format_duration(59.6), "1m00s");
  EXPECT_EQ(ProgressLogger::format_duration(3725), "1h02m");
  MetricsOptions bad;
  bad.log_every = -1;
  EXPECT_THROW(ProgressLogger(bad, 1, 0, 1, sources_), ConfigError);
  MetricsOptions unwritable;
  unwritable.file = dir_ + "/no/such/dir/metrics.jsonl";
  EXPECT_THROW(ProgressLogger(unwritable, 1, 0, 1, sources_), ConfigError);
}

}  // namespace
}  // namespace tandem
