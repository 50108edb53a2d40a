// The program's own config keys (issue 19): registered app.* keys merge from YAML, TANDEM_APP_* and
// --set, are validated with the same messages and "did you mean" as tandem's keys, print and load
// back; a program that registers none gets a free app section; misspelt keys and sections get a
// suggestion. Its own executable: registration changes the process-wide key registry.
#include <tandem/base/errors.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/config_keys.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace tandem {
namespace {

std::string problems_of(const ConfigInputs& inputs) {
  try {
    load_config(inputs);
  } catch (const InvalidConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(AppConfig, AFreeAppSectionTakesAnyKeyUntilTheProgramRegistersItsOwn) {
  // Nothing registered: any app.* key, from every source, as text.
  char tmpl[] = "/tmp/tandem-app-config-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string yaml = std::string(tmpl) + "/app.yaml";
  std::ofstream(yaml) << "app:\n  warmup: 10\n  data:\n    path: /tmp/x\n";
  LoadedConfig c = load_config({{yaml}, {{"TANDEM_APP_LAYERS", "4"}}, {"app.name=demo"}});
  EXPECT_EQ(c.config.app_value<int64_t>("app.warmup"), 10);
  EXPECT_EQ(c.config.app_value<std::string>("app.data.path"), "/tmp/x");
  EXPECT_EQ(c.config.app_value<int64_t>("app.layers"), 4);
  EXPECT_EQ(c.config.app_value<std::string>("app.name"), "demo");
  EXPECT_EQ(c.source.at("app.name"), "--set");
  EXPECT_NE(config_to_yaml(c.config).find("warmup: \"10\""), std::string::npos) << config_to_yaml(c.config);
  EXPECT_THROW(c.config.app_value<int64_t>("app.name"), ConfigError);  // "demo" is not an int
  EXPECT_THROW(c.config.app_value<int64_t>("app.missing"), ConfigError);
  std::remove(yaml.c_str());
  ::rmdir(tmpl);

  // Registered keys: typed, checked, defaulted, documented.
  register_app_key<int64_t>("app.hidden", 256, "Hidden width of the model.",
                            [](const int64_t& v) { return v > 0; }, "> 0");
  register_app_key<double>("app.dropout", 0.1, "Dropout probability.",
                           [](const double& v) { return v >= 0 && v < 1; }, "[0, 1)");
  register_app_key<bool>("app.tie_embeddings", true, "Share input and output embeddings.");
  register_app_key<std::string>("app.tokenizer", "bytes", "Tokenizer name.");
  EXPECT_THROW(register_app_key<int64_t>("hidden", 1, "not in app"), ConfigError);
  EXPECT_THROW(register_app_key<int64_t>("app.hidden", 1, "twice"), ConfigError);
  EXPECT_THROW(register_app_key<int64_t>("app.bad", -1, "bad default", [](const int64_t& v) { return v > 0; }),
               ConfigError);

  c = load_config({{}, {{"TANDEM_APP_DROPOUT", "0.25"}}, {"app.hidden=512"}});
  EXPECT_EQ(c.config.app_value<int64_t>("app.hidden"), 512);
  EXPECT_EQ(c.config.app_value<double>("app.dropout"), 0.25);
  EXPECT_TRUE(c.config.app_value<bool>("app.tie_embeddings"));  // the default
  EXPECT_EQ(c.config.app_value<std::string>("app.tokenizer"), "bytes");
  EXPECT_EQ(c.source.at("app.dropout"), "TANDEM_APP_DROPOUT");

  // The same messages as tandem's own keys.
  EXPECT_NE(problems_of({{}, {}, {"app.hidden=-3"}}).find("app.hidden must be > 0, got '-3' (default 256)"),
            std::string::npos) << problems_of({{}, {}, {"app.hidden=-3"}});
  EXPECT_NE(problems_of({{}, {}, {"app.hidden=wide"}}).find("app.hidden expects an int (> 0), got 'wide'"),
            std::string::npos) << problems_of({{}, {}, {"app.hidden=wide"}});
  EXPECT_NE(problems_of({{}, {}, {"app.hiden=3"}}).find("did you mean 'app.hidden'?"), std::string::npos)
      << problems_of({{}, {}, {"app.hiden=3"}});
  EXPECT_NE(problems_of({{}, {}, {"app.warmup=3"}}).find("unknown key 'app.warmup'"), std::string::npos)
      << "registered keys make the section closed";

  // Listed, printed and read back like every key.
  bool listed = false;
  for (const auto& k : config_keys()) listed = listed || (k.key == "app.dropout" && k.env == "TANDEM_APP_DROPOUT");
  EXPECT_TRUE(listed);
  EXPECT_NE(config_defaults_markdown("app").find("`app.hidden` | int | `256` | > 0"), std::string::npos)
      << config_defaults_markdown("app");
  const std::string printed = config_to_yaml(c.config);
  char tmpl2[] = "/tmp/tandem-app-config-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl2), nullptr);
  const std::string back = std::string(tmpl2) + "/back.yaml";
  std::ofstream(back) << printed;
  const LoadedConfig again = load_config({{back}, {}, {}});
  EXPECT_EQ(config_to_yaml(again.config), printed);
  EXPECT_EQ(again.config.app_value<int64_t>("app.hidden"), 512);
  std::remove(back.c_str());
  ::rmdir(tmpl2);
}

TEST(AppConfig, MisspeltSectionsAndShortenedKeysGetASuggestion) {
  EXPECT_EQ(suggest_config_key("ddp.find_unused"), "ddp.find_unused_parameters");
  EXPECT_EQ(suggest_config_key("dpp.find_unused_parameters"), "ddp.find_unused_parameters");
  EXPECT_EQ(suggest_config_key("chekpoint.keep_last"), "checkpoint.keep_last");
  EXPECT_NE(problems_of({{}, {}, {"ddp.find_unused=true"}}).find("did you mean 'ddp.find_unused_parameters'?"),
            std::string::npos) << problems_of({{}, {}, {"ddp.find_unused=true"}});
}

}  // namespace
}  // namespace tandem
