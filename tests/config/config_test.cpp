// The config system in-process: merge order of the four sources, every error class with its
// exact message, printed defaults against the structs, YAML round trip, argv handling.
#include <tandem/runtime/config.h>
#include <tandem/runtime/config_keys.h>

#include "tests/support/test_support.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace tandem {
namespace {

// A YAML file in a fresh directory, removed at the end of the test.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tandem-config-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : files_) std::remove(f.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string file(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    files_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> files_;
};

// The message of the InvalidConfigError `inputs` raise (fails the test when none is raised).
std::vector<std::string> problems(const ConfigInputs& inputs) {
  try {
    load_config(inputs);
  } catch (const InvalidConfigError& e) {
    std::vector<std::string> out;
    for (const auto& i : e.issues()) out.push_back(i.message);
    return out;
  }
  ADD_FAILURE() << "no InvalidConfigError";
  return {};
}

std::string one_problem(const ConfigInputs& inputs) {
  const auto all = problems(inputs);
  EXPECT_EQ(all.size(), 1u);
  return all.empty() ? "" : all[0];
}

TEST_F(ConfigTest, MergeOrderDefaultsFilesEnvironmentSet) {
  // a: file 1 only, b: file 2 over file 1, c: env over files, d: --set over all; e: untouched.
  const auto f1 = file("one.yaml",
                       "train:\n  steps: 11\n  batch_size: 11\n  seed: 11\n  lr: 0.11\n");
  const auto f2 = file("two.yaml", "train: {batch_size: 22, seed: 22, lr: 0.22}\n");
  ConfigInputs in;
  in.files = {f1, f2};
  in.env = {{"TANDEM_TRAIN_SEED", "33"}, {"TANDEM_TRAIN_LR", "0.33"}};
  in.sets = {"train.lr=0.5", "train.lr=0.44"};  // later --set wins too
  const LoadedConfig c = load_config(in);
  EXPECT_EQ(c.config.train.steps, 11);
  EXPECT_EQ(c.config.train.batch_size, 22);
  EXPECT_EQ(c.config.train.seed, 33u);
  EXPECT_DOUBLE_EQ(c.config.train.lr, 0.44);
  EXPECT_EQ(c.config.train.weight_decay, TrainOptions{}.weight_decay);
  EXPECT_EQ(c.source.at("train.steps"), f1 + ":2:10");
  EXPECT_EQ(c.source.at("train.batch_size"), f2 + ":1:21");
  EXPECT_EQ(c.source.at("train.seed"), "TANDEM_TRAIN_SEED");
  EXPECT_EQ(c.source.at("train.lr"), "--set");
  EXPECT_EQ(c.source.count("train.weight_decay"), 0u);
}

TEST_F(ConfigTest, NewEnvironmentNameWinsOverTheOlderAlias) {
  ConfigInputs in;
  in.env = {{"TANDEM_TIMEOUT_S", "7"}, {"TANDEM_SHM", "0"}};
  LoadedConfig c = load_config(in);
  EXPECT_EQ(c.config.comm.timeout.count(), 7000);
  EXPECT_FALSE(c.config.comm.shared_memory);
  in.env["TANDEM_COMM_TIMEOUT_S"] = "2.5";
  c = load_config(in);
  EXPECT_EQ(c.config.comm.timeout.count(), 2500);
  EXPECT_EQ(c.source.at("comm.timeout_s"), "TANDEM_COMM_TIMEOUT_S");
}

TEST_F(ConfigTest, LauncherTraceDirectoryTurnsTracingOnUnlessSaidOtherwise) {
  LoadedConfig c = load_config({{}, {{"TANDEM_TRACE_DIR", "run1/trace"}}, {}});
  EXPECT_TRUE(c.config.trace.enabled);
  EXPECT_EQ(c.config.trace.dir, "run1/trace");
  EXPECT_EQ(c.source.at("trace.enabled"), "TANDEM_TRACE_DIR");
  c = load_config({{}, {{"TANDEM_TRACE_DIR", "t"}, {"TANDEM_TRACE_ENABLED", "false"}}, {}});
  EXPECT_FALSE(c.config.trace.enabled);
  c = load_config({{}, {{"TANDEM_TRACE_DIR", "t"}}, {"trace.enabled=false"}});
  EXPECT_FALSE(c.config.trace.enabled);
  EXPECT_FALSE(load_config({}).config.trace.enabled);
}

TEST_F(ConfigTest, NestedMapsAndDottedKeysAreTheSame) {
  const auto nested = file("n.yaml", "compression:\n  codec: topk\n  topk:\n    ratio: 0.25\n");
  const auto dotted = file("d.yaml", "compression.codec: topk\ncompression:\n  topk.ratio: 0.25\n");
  for (const auto& f : {nested, dotted}) {
    const LoadedConfig c = load_config({{f}, {}, {}});
    EXPECT_EQ(c.config.compression.codec, "topk") << f;
    EXPECT_DOUBLE_EQ(c.config.compression.topk.ratio, 0.25) << f;
    ASSERT_NE(c.config.ddp.codec, nullptr);
    EXPECT_EQ(c.config.ddp.codec->name(), "topk");
  }
}

TEST_F(ConfigTest, CodecIsBuiltFromTheCompressionSection) {
  EXPECT_EQ(load_config({}).config.ddp.codec,
            nullptr);  // plain average: DistributedDataParallel's own
  auto c = load_config({{}, {}, {"compression.codec=powersgd", "compression.wire=fp16"}});
  ASSERT_NE(c.config.ddp.codec, nullptr);
  EXPECT_EQ(c.config.ddp.codec->name(), "powersgd+fp16");
  c = load_config({{}, {}, {"compression.codec=bf16"}});
  EXPECT_EQ(c.config.ddp.codec->name(), "bf16");
  EXPECT_EQ(one_problem({{}, {}, {"compression.codec=fp16", "compression.wire=bf16"}}),
            "--set: compression.codec = fp16 cannot take compression.wire = bf16; use "
            "compression.codec = bf16 (or wire fp32).");
  // auto: compression.wire names the cast it may choose (fp32: bf16).
  c = load_config({{}, {}, {"compression.codec=auto", "compression.auto.min_speedup=0"}});
  EXPECT_EQ(c.config.ddp.codec->name(), "auto");
  EXPECT_EQ(c.config.compression.automatic.min_speedup, 0.0);
  for (const auto& [wire, chosen] : {std::pair{"fp32", "auto(bf16)"}, std::pair{"fp16", "auto(fp16)"}}) {
    c = load_config({{}, {}, {"compression.codec=auto", std::string("compression.wire=") + wire,
                              "compression.auto.min_speedup=0"}});
    std::vector<std::string> names(2);
    testing::run_ranks(2, [&](Communicator& comm) {
      auto codec = c.config.make_codec();
      GradBucket b;
      b.buffer = at::ones({8});
      b.param_indices = {0};
      b.offsets = {0};
      b.shapes = {{8}};
      codec->reduce(comm, b)->wait();
      names[comm.rank()] = codec->name();
    });
    EXPECT_EQ(names[0], chosen);
    EXPECT_EQ(names[1], chosen);
  }
}

TEST_F(ConfigTest, BytesAndListsParse) {
  const auto f = file("b.yaml", "allocator:\n  limit_bytes: 3GiB\npipeline:\n  balance: [2, 3, 1]\n");
  const LoadedConfig c = load_config({{f}, {}, {"allocator.pool.small_size=512KiB"}});
  EXPECT_EQ(c.config.allocator.stack.limit_bytes, std::size_t{3} << 30);
  EXPECT_EQ(c.config.allocator.stack.pool.small_size, std::size_t{512} << 10);
  EXPECT_EQ(c.config.pipeline.balance, (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(load_config({{}, {}, {"pipeline.balance=4,4"}}).config.pipeline.balance,
            (std::vector<int64_t>{4, 4}));
}

// ---- every error class, exact messages --------------------------------------------------------

TEST_F(ConfigTest, UnknownKeyNamesFileLineValueAndSuggestion) {
  const auto f = file("u.yaml", "ddp:\n  bucket_cap: 10\n");
  EXPECT_EQ(one_problem({{f}, {}, {}}),
            f + ":2:3: unknown key 'ddp.bucket_cap' (value '10'); did you mean 'ddp.bucket_cap_mb'? "
                "'tandem-config defaults' lists every key.");
  // The right name in the wrong section, and a typo in the section.
  EXPECT_EQ(one_problem({{}, {}, {"pipeline.bucket_cap_mb=3"}}),
            "--set pipeline.bucket_cap_mb=3: unknown key 'pipeline.bucket_cap_mb' (value '3'); did you "
            "mean 'ddp.bucket_cap_mb'? 'tandem-config defaults' lists every key.");
  EXPECT_EQ(one_problem({{}, {}, {"compresion.codec=topk"}}),
            "--set compresion.codec=topk: unknown key 'compresion.codec' (value 'topk'); did you mean "
            "'compression.codec'? 'tandem-config defaults' lists every key.");
  EXPECT_EQ(one_problem({{}, {}, {"zzz=1"}}),
            "--set zzz=1: unknown key 'zzz' (value '1'); 'tandem-config defaults' lists every key.");
}

TEST_F(ConfigTest, WrongTypeNamesExpectedType) {
  const auto f = file("t.yaml", "ddp:\n  bucket_cap_mb: ten\n  broadcast_buffers: yes\n");
  const auto all = problems({{f}, {}, {}});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], f + ":2:18: ddp.bucket_cap_mb expects a float (> 0), got 'ten' (default 25).");
  EXPECT_EQ(all[1], f + ":3:22: ddp.broadcast_buffers expects a bool (true | false), got 'yes' (default true).");
  EXPECT_EQ(one_problem({{}, {{"TANDEM_TRAIN_STEPS", "1.5"}}, {}}),
            "TANDEM_TRAIN_STEPS: train.steps expects an int (>= 0), got '1.5' (default 100).");
  const auto m = file("m.yaml", "ddp:\n  bucket_cap_mb: {a: 1}\ntrain: 5\n");
  const auto both = problems({{m}, {}, {}});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0], m + ":2:18: ddp.bucket_cap_mb expects a float, got a map.");
  EXPECT_EQ(both[1], m + ":3:8: 'train' is a section, not a key (value '5'); set one of its keys, e.g. "
                         "'train.steps'.");
}

TEST_F(ConfigTest, OutOfRangeNamesTheRange) {
  EXPECT_EQ(one_problem({{}, {}, {"ddp.bucket_cap_mb=-1"}}),
            "--set ddp.bucket_cap_mb=-1: ddp.bucket_cap_mb must be > 0, got '-1' (default 25).");
  EXPECT_EQ(one_problem({{}, {{"TANDEM_COMPRESSION_TOPK_RATIO", "1.5"}}, {}}),
            "TANDEM_COMPRESSION_TOPK_RATIO: compression.topk.ratio must be (0, 1], got '1.5' (default 0.01).");
  EXPECT_EQ(one_problem({{}, {}, {"pipeline.num_microbatches=99999999999"}}),
            "--set pipeline.num_microbatches=99999999999: pipeline.num_microbatches must be >= 1, got "
            "'99999999999' (default 4).");
  EXPECT_EQ(one_problem({{}, {}, {"compression.auto.min_speedup=-1"}}),
            "--set compression.auto.min_speedup=-1: compression.auto.min_speedup must be >= 0, got "
            "'-1' (default 1.25).");
}

TEST_F(ConfigTest, BadChoiceListsChoicesAndSuggests) {
  const auto f = file("c.yaml", "pipeline: {schedule: 1f1c}\n");
  EXPECT_EQ(one_problem({{f}, {}, {}}),
            f + ":1:22: pipeline.schedule must be one of gpipe | 1f1b | interleaved | zbh1, got '1f1c'; "
                "did you mean '1f1b'?");
  EXPECT_EQ(one_problem({{}, {}, {"activation.check=everything"}}),
            "--set activation.check=everything: activation.check must be one of none | metadata | values, "
            "got 'everything'.");
}

TEST_F(ConfigTest, YamlSyntaxErrorHasLineAndColumn) {
  const auto f = file("s.yaml", "ddp:\n  bucket_cap_mb: 10\n   first_bucket_cap_mb: 2\n");
  EXPECT_EQ(one_problem({{f}, {}, {}}), f + ":3:23: YAML syntax error: illegal map value.");
  const auto g = file("g.yaml", "- just\n- a list\n");
  EXPECT_EQ(one_problem({{g}, {}, {}}),
            g + ":1:1: a config file must be a map of keys (e.g. 'ddp: {bucket_cap_mb: 10}').");
  EXPECT_EQ(one_problem({{dir_ + "/missing.yaml"}, {}, {}}),
            dir_ + "/missing.yaml: cannot read the config file (No such file or directory); check the "
                   "--config path.");
}

TEST_F(ConfigTest, UnknownTandemVariablesOfASectionAreErrorsOthersAreNotConfig) {
  EXPECT_EQ(one_problem({{}, {{"TANDEM_DDP_BUCKET_CAP", "10"}}, {}}),
            "TANDEM_DDP_BUCKET_CAP: unknown config variable TANDEM_DDP_BUCKET_CAP='10'; did you mean "
            "TANDEM_DDP_BUCKET_CAP_MB (ddp.bucket_cap_mb)? TANDEM_<SECTION>_* variables must name a key "
            "('tandem-config defaults' lists them).");
  // Not config: the launcher's heartbeat file, test switches, the older comm names (config).
  const LoadedConfig c = load_config({{},
                                      {{"TANDEM_HEARTBEAT_FILE", "/tmp/hb"},
                                       {"TANDEM_TEST_MARKER", "x"},
                                       {"TANDEM_SHM_TEST_ROLE", "child"},
                                       {"TANDEM_GLOO_IFNAME", "lo"}},
                                      {}});
  EXPECT_EQ(c.config.comm.gloo_interface, "lo");
}

TEST_F(ConfigTest, SetWithoutEqualsAndFlagsWithoutValues) {
  EXPECT_EQ(one_problem({{}, {}, {"ddp.bucket_cap_mb"}}),
            "--set ddp.bucket_cap_mb: expected --set key=value (e.g. --set ddp.bucket_cap_mb=10), got "
            "'ddp.bucket_cap_mb'.");
  char a0[] = "prog", a1[] = "--set";
  char* argv[] = {a0, a1, nullptr};
  int argc = 2;
  try {
    take_config_args(argc, argv);
    ADD_FAILURE() << "no error";
  } catch (const InvalidConfigError& e) {
    EXPECT_STREQ(e.what(), "tandem: invalid configuration (1 problem):\n  --set: missing value (--set key=value).");
  }
}

TEST_F(ConfigTest, AllProblemsOfOneLoadAreReportedTogether) {
  const auto f = file("all.yaml", "ddp: {bucket_cap: 1}\ntrain: {steps: -2}\n");
  try {
    load_config({{f}, {{"TANDEM_TRAIN_LRR", "1"}}, {"nope"}});
    FAIL() << "no error";
  } catch (const InvalidConfigError& e) {
    ASSERT_EQ(e.issues().size(), 4u);
    EXPECT_EQ(e.issues()[0].key, "ddp.bucket_cap");
    EXPECT_EQ(e.issues()[1].source, f + ":2:16");
    EXPECT_EQ(e.issues()[1].value, "-2");
    EXPECT_EQ(e.issues()[2].source, "TANDEM_TRAIN_LRR");
    EXPECT_EQ(e.issues()[3].source, "--set nope");
    EXPECT_EQ(std::string(e.what()).rfind("tandem: invalid configuration (4 problems):\n  ", 0), 0u);
    // Catchable as every tandem config error.
    EXPECT_NE(dynamic_cast<const ConfigError*>(&e), nullptr);
  }
}

// ---- defaults, printing, round trip -----------------------------------------------------------

TEST(ConfigRegistry, PrintedDefaultsAreTheStructDefaults) {
  const Config defaults;
  // Independent of the registry's own getters: a few members read straight from their structs.
  const std::map<std::string, std::string> direct = {
      {"comm.timeout_s", std::to_string(InitOptions{}.timeout.count() / 1000)},
      {"pipeline.schedule", PipelineOptions{}.schedule},
      {"pipeline.num_microbatches", std::to_string(PipelineOptions{}.num_microbatches)},
      {"checkpoint.keep_last", std::to_string(CheckpointManagerOptions{}.keep_last)},
      {"compression.powersgd.start_iter", std::to_string(PowerSgdOptions{}.start_iter)},
      {"metrics.log_every", std::to_string(MetricsOptions{}.log_every)},
      {"trace.dir", TraceOptions{}.dir},
      {"allocator.pool.min_block_size", std::to_string(memory::CachingPoolOptions{}.min_block_size)},
  };
  for (const auto& [key, value] : direct) EXPECT_EQ(config_value(defaults, key), value) << key;
  EXPECT_EQ(std::stod(config_value(defaults, "ddp.bucket_cap_mb")),
            DistributedDataParallelOptions{}.bucket_cap_mb);
  EXPECT_EQ(std::stod(config_value(defaults, "compression.topk.ratio")), TopKOptions{}.ratio);

  const std::string text = config_defaults_text();
  const std::string markdown = config_defaults_markdown();
  for (const auto& k : config_keys()) {
    EXPECT_EQ(config_value(defaults, k.key), k.default_value) << k.key;
    // Setting a key to its printed default leaves the whole config at the defaults.
    const LoadedConfig c = load_config({{}, {}, {k.key + "=" + k.default_value}});
    for (const auto& other : config_keys())
      ASSERT_EQ(config_value(c.config, other.key), other.default_value) << k.key << " -> " << other.key;
    const std::string shown = k.type == "string" ? "\"" + k.default_value + "\"" : k.default_value;
    EXPECT_NE(text.find(k.key + " = " + shown + "\n"), std::string::npos) << k.key;
    EXPECT_NE(markdown.find("| `" + k.key + "` | " + k.type + " | "), std::string::npos) << k.key;
    EXPECT_FALSE(k.doc.empty()) << k.key;
  }
}

TEST(ConfigRegistry, EnvironmentNamesFollowTheKeysAndAreUnique) {
  std::map<std::string, std::string> seen;
  for (const auto& k : config_keys()) {
    std::string expected = "TANDEM_";
    for (char c : k.key) expected += c == '.' ? '_' : static_cast<char>(std::toupper(c));
    EXPECT_EQ(k.env, expected);
    EXPECT_TRUE(seen.emplace(k.env, k.key).second) << k.env;
    if (!k.env_alias.empty()) {
      EXPECT_TRUE(seen.emplace(k.env_alias, k.key).second) << k.env_alias;
    }
  }
  EXPECT_EQ(seen.at("TANDEM_DDP_BUCKET_CAP_MB"), "ddp.bucket_cap_mb");
  EXPECT_EQ(seen.at("TANDEM_SHM"), "comm.shared_memory");
}

// A value of `k` other than its default, accepted by the key (every key is settable).
std::string other_value(const ConfigKeyInfo& k) {
  if (k.type == "bool") return k.default_value == "true" ? "false" : "true";
  if (k.type == "string") return "a \"quoted\" value: with # and \\";
  if (k.type == "list<int>") return "[3, 1, 2]";
  std::vector<std::string> candidates;
  if (k.type == "choice") {
    std::size_t start = 0;
    while (true) {
      const auto bar = k.allowed.find(" | ", start);
      candidates.push_back(k.allowed.substr(start, bar - start));
      if (bar == std::string::npos) break;
      start = bar + 3;
    }
  } else {
    candidates = {"3", "0.5", "0.25", "7", "2", "4096", "64KiB"};
  }
  for (const auto& v : candidates) {
    if (v == k.default_value) continue;
    try {
      load_config({{}, {}, {k.key + "=" + v}});
      return v;
    } catch (const InvalidConfigError&) {
    }
  }
  return "";
}

TEST_F(ConfigTest, EffectiveConfigPrintsAsYamlThatLoadsBackToTheSameConfig) {
  std::vector<std::string> sets;
  for (const auto& k : config_keys()) {
    const std::string v = other_value(k);
    ASSERT_FALSE(v.empty()) << "no non-default value accepted by " << k.key;
    sets.push_back(k.key + "=" + v);
  }
  const LoadedConfig changed = load_config({{}, {}, sets});
  for (const auto& k : config_keys())
    EXPECT_NE(config_value(changed.config, k.key), k.default_value) << k.key;

  const std::string yaml = config_to_yaml(changed.config, &changed.source);
  EXPECT_NE(yaml.find("  bucket_cap_mb: 3  # --set\n"), std::string::npos) << yaml;
  const LoadedConfig back = load_config({{file("rt.yaml", yaml)}, {}, {}});
  for (const auto& k : config_keys())
    EXPECT_EQ(config_value(back.config, k.key), config_value(changed.config, k.key)) << k.key;
  EXPECT_EQ(config_to_yaml(back.config), config_to_yaml(changed.config));
  EXPECT_EQ(back.config.ddp.codec->name(), changed.config.ddp.codec->name());
}

TEST(ConfigArgs, TakesTandemFlagsAndKeepsTheProgramsArguments) {
  std::vector<std::string> words = {"prog", "--steps", "5", "--config", "a.yaml", "--set=ddp.bucket_cap_mb=3",
                                    "input.txt", "--config=b.yaml", "--print-config", "--set", "train.lr=1",
                                    "--", "--set", "kept"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(words.size());
  const ConfigArgs a = take_config_args(argc, argv.data());
  EXPECT_EQ(a.files, (std::vector<std::string>{"a.yaml", "b.yaml"}));
  EXPECT_EQ(a.sets, (std::vector<std::string>{"ddp.bucket_cap_mb=3", "train.lr=1"}));
  EXPECT_TRUE(a.print_config);
  EXPECT_FALSE(a.help_config);
  ASSERT_EQ(argc, 7);
  EXPECT_EQ(argv[7], nullptr);
  const std::vector<std::string> rest(argv.begin(), argv.begin() + argc);
  EXPECT_EQ(rest, (std::vector<std::string>{"prog", "--steps", "5", "input.txt", "--", "--set", "kept"}));
}

TEST(ConfigLauncherEnv, CommEnvComesFromTheLauncherVariables) {
  const LoadedConfig c = load_config({{},
                                      {{"RANK", "1"},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "127.0.0.1"},
                                       {"MASTER_PORT", "29511"},
                                       {"TORCHELASTIC_RUN_ID", "job7"},
                                       {"TORCHELASTIC_RESTART_COUNT", "3"}},
                                      {}});
  EXPECT_EQ(c.config.comm.env.rank, 1);
  EXPECT_EQ(c.config.comm.env.world_size, 2);
  EXPECT_EQ(c.config.comm.store_prefix, "tandem/job7/restart3");
  const auto all = problems({{}, {{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {}});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].rfind("launcher environment: ", 0), 0u) << all[0];
}

// What a bare init() reads: the comm section as a Context reads it (the new names included, which
// init() once ignored), and no other section's variables, not even a bad one.
TEST(ConfigLauncherEnv, CommSectionAloneIsWhatInitReads) {
  const InitOptions o = load_comm_config({{"RANK", "1"},
                                          {"WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", "29511"},
                                          {"TORCHELASTIC_RUN_ID", "job7"},
                                          {"TANDEM_COMM_SHARED_MEMORY", "0"},
                                          {"TANDEM_COMM_BACKEND", "gloo"},
                                          {"TANDEM_TIMEOUT_S", "7"},
                                          {"TANDEM_DDP_BUCKET_CAP_MB", "lots"},
                                          {"TANDEM_DDP_NO_SUCH_KEY", "1"}});
  EXPECT_FALSE(o.shared_memory);
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.timeout.count(), 7000);
  EXPECT_EQ(o.env.rank, 1);
  EXPECT_EQ(o.store_prefix, "tandem/job7/restart0");
  for (const auto& [name, value] : std::map<std::string, std::string>{
           {"TANDEM_COMM_TIMEOUT_S", "soon"}, {"TANDEM_SHM", "yes"}, {"TANDEM_COMM_NO_SUCH_KEY", "1"}}) {
    try {
      load_comm_config({{name, value}});
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const InvalidConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem
