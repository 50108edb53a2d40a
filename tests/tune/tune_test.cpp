// tandem-tune's logic (runtime/tune/tune_plan.h): grid parsing and expansion, validation through
// the config registry, trial command lines, throughput from metrics files, table and best YAML.
#include <gtest/gtest.h>
#include <tandem/base/errors.h>
#include <tandem/runtime/config.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/tandem-tune/tune_plan.h"

namespace tandem::tune {
namespace {

std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem_tune_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TunePlan, ParsesAxesAndRejectsMalformedOnes) {
  const Axis a = parse_axis("ddp.bucket_cap_mb=1,5,25");
  EXPECT_EQ(a.key, "ddp.bucket_cap_mb");
  EXPECT_EQ(a.values, (std::vector<std::string>{"1", "5", "25"}));
  EXPECT_NE(error_of([] { parse_axis("ddp.bucket_cap_mb"); }).find("is not key=v1,v2"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_axis("=1,2"); }).find("is not key=v1,v2"), std::string::npos);
  EXPECT_NE(error_of([] { parse_axis("a=1,,2"); }).find("empty value"), std::string::npos);
  EXPECT_NE(error_of([] { parse_axis("a=1,2,"); }).find("empty value"), std::string::npos);
  EXPECT_NE(error_of([] { parse_axis("a=1,1"); }).find("lists the value '1' twice"),
            std::string::npos);
}

TEST(TunePlan, ExpandsEveryCombinationFirstAxisSlowest) {
  const auto trials = expand({parse_axis("a=1,2"), parse_axis("b=x,y,z")});
  ASSERT_EQ(trials.size(), 6u);
  EXPECT_EQ(trials[0], (Trial{{"a", "1"}, {"b", "x"}}));
  EXPECT_EQ(trials[2], (Trial{{"a", "1"}, {"b", "z"}}));
  EXPECT_EQ(trials[3], (Trial{{"a", "2"}, {"b", "x"}}));
  EXPECT_NE(error_of([] { expand({parse_axis("a=1"), parse_axis("a=2")}); }).find("twice"),
            std::string::npos);
}

TEST(TunePlan, ValidatesValuesThroughTheConfigRegistryBeforeRunning) {
  EXPECT_NO_THROW(validate(expand({parse_axis("ddp.bucket_cap_mb=1,25"),
                                   parse_axis("compression.codec=average,fp16")})));
  const std::string typo =
      error_of([] { validate(expand({parse_axis("ddp.bucket_cap=1,25")})); });
  EXPECT_NE(typo.find("did you mean 'ddp.bucket_cap_mb'"), std::string::npos) << typo;
  const std::string choice =
      error_of([] { validate(expand({parse_axis("compression.codec=average,fp61")})); });
  EXPECT_NE(choice.find("fp61"), std::string::npos) << choice;
}

TEST(TunePlan, TrialCommandAppendsTheGridAndTheTunersOwnSettings) {
  const auto argv = trial_command({"tandemrun", "--nproc-per-node", "2", "prog", "--x"},
                                  Trial{{"ddp.bucket_cap_mb", "5"}}, 30, 10, "m.jsonl");
  const std::vector<std::string> want = {
      "tandemrun", "--nproc-per-node", "2", "prog", "--x",
      "--set", "ddp.bucket_cap_mb=5", "--set", "train.steps=30",
      "--set", "metrics.log_every=10", "--set", "metrics.file=m.jsonl"};
  EXPECT_EQ(argv, want);
}

TEST(TunePlan, ThroughputIsTheMedianAfterTheWarmUp) {
  const auto f = temp_file("m.jsonl",
                           "{\"step\":10,\"loss\":2,\"samples_per_s\":5,\"elapsed_s\":1}\n"
                           "{\"step\":20,\"loss\":1,\"samples_per_s\":300,\"elapsed_s\":2}\n"
                           "{\"step\":30,\"loss\":1,\"samples_per_s\":100,\"elapsed_s\":3}\n"
                           "{\"step\":40,\"loss\":1,\"samples_per_s\":200,\"elapsed_s\":4}\n");
  EXPECT_EQ(throughput(f, 1), 200.0);  // median of 300, 100, 200
  EXPECT_EQ(throughput(f, 2), 150.0);  // median of 100, 200
  EXPECT_EQ(throughput(f, 4), std::nullopt);
  EXPECT_EQ(throughput(f + ".missing", 0), std::nullopt);
  const auto bad = temp_file("bad.jsonl", "{\"step\":10,\"samples_per_s\":5}\nnot json\n");
  const std::string e = error_of([&] { throughput(bad, 0); });
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("ProgressLogger"), std::string::npos) << e;
  std::filesystem::remove(f);
  std::filesystem::remove(bad);
}

TEST(TunePlan, TableMarksTheBestAndFailedTrials) {
  std::vector<TrialResult> results = {
      {Trial{{"ddp.bucket_cap_mb", "1"}}, 100.0, "ok"},
      {Trial{{"ddp.bucket_cap_mb", "5"}}, 250.0, "ok"},
      {Trial{{"ddp.bucket_cap_mb", "25"}}, std::nullopt, "exit 1 (see trial_3.log)"}};
  EXPECT_EQ(best(results), 1u);
  const std::string table = format_table(results);
  EXPECT_NE(table.find("ddp.bucket_cap_mb=5"), std::string::npos) << table;
  EXPECT_NE(table.find("250.0     1.000  ok  <- best"), std::string::npos) << table;
  EXPECT_NE(table.find("100.0     0.400  ok\n"), std::string::npos) << table;
  EXPECT_NE(table.find("exit 1 (see trial_3.log)"), std::string::npos) << table;
  results[1].samples_per_s.reset();
  results[0].samples_per_s.reset();
  EXPECT_EQ(best(results), std::nullopt);
}

TEST(TunePlan, ScalingReplacesTheRankCountAndComputesEfficiency) {
  const std::vector<std::string> cmd = {"tandemrun", "--standalone", "--nproc-per-node", "1", "train"};
  EXPECT_EQ(scale_command(cmd, 4)[3], "4");
  EXPECT_EQ(scale_command({"tandemrun", "--nproc_per_node=2", "train"}, 3)[1], "--nproc_per_node=3");
  EXPECT_THROW(scale_command({"train"}, 2), ConfigError);
  const std::string table = format_scaling_table({{1, 100.0, "ok"}, {2, 180.0, "ok"}, {4, std::nullopt, "exit 1"}});
  EXPECT_NE(table.find("1.80x"), std::string::npos) << table;
  EXPECT_NE(table.find("90.0%"), std::string::npos) << table;  // (T1/T2)/2 = 180 / (2 x 100)
  EXPECT_NE(table.find("failed: exit 1"), std::string::npos) << table;
}

TEST(TunePlan, BestConfigYamlLoadsBackIntoTheSameValues) {
  const TrialResult r{Trial{{"ddp.bucket_cap_mb", "5"},
                            {"compression.codec", "powersgd"},
                            {"compression.powersgd.rank", "4"},
                            {"metrics.file", "out: a#b.jsonl"}},
                      1.0, "ok"};
  const std::string yaml = best_config_yaml(r, "from a test\nsecond line");
  EXPECT_EQ(yaml.rfind("# from a test\n# second line\n", 0), 0u) << yaml;
  const auto path = temp_file("best.yaml", yaml);
  ConfigInputs inputs;
  inputs.files = {path};
  const LoadedConfig loaded = load_config(inputs);
  EXPECT_EQ(loaded.config.ddp.bucket_cap_mb, 5.0);
  EXPECT_EQ(loaded.config.compression.codec, "powersgd");
  EXPECT_EQ(loaded.config.compression.powersgd.rank, 4);
  EXPECT_EQ(loaded.config.metrics.file, "out: a#b.jsonl");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tandem::tune
