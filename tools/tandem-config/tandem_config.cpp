// tandem-config: every config key with its default and doc, the effective config of a command
// line, or a check of it (docs/config.md).
//
//   tandem-config defaults [--markdown] [--section ddp]
//   tandem-config print --config train.yaml --set ddp.bucket_cap_mb=10 [--no-sources]
//   tandem-config check --config train.yaml      (exit 0: valid; exit 2: the problems on stderr)
//
// print and check read the TANDEM_* variables of the environment too, as a training program would.
#include <tandem/runtime/config_keys.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"tandem-config: the keys of tandem's configuration and the effective values"};
  app.require_subcommand(1);

  bool markdown = false;
  std::string section;
  auto* defaults = app.add_subcommand("defaults", "every key: type, default, allowed values, env variable, doc");
  defaults->add_flag("--markdown", markdown, "one Markdown table per section (for docs/)");
  defaults->add_option("--section", section, "with --markdown: only this section (e.g. ddp)");

  std::vector<std::string> files, sets;
  bool no_sources = false;
  auto* print = app.add_subcommand("print", "the effective config as YAML, each value's source as a comment");
  auto* check = app.add_subcommand("check", "validate; exit 2 with every problem found");
  for (auto* cmd : {print, check}) {
    cmd->add_option("--config", files, "YAML file (repeatable; later wins)");
    cmd->add_option("--set", sets, "key=value override (repeatable; wins over files and environment)");
  }
  print->add_flag("--no-sources", no_sources, "omit the '# source' comments");

  CLI11_PARSE(app, argc, argv);

  if (*defaults) {
    if (!section.empty()) {
      const auto& all = tandem::config_sections();
      if (std::find(all.begin(), all.end(), section) == all.end()) {
        std::fprintf(stderr, "tandem-config: no section '%s'; sections:", section.c_str());
        for (const auto& s : all) std::fprintf(stderr, " %s", s.c_str());
        std::fprintf(stderr, "\n");
        return 2;
      }
    }
    std::fputs(markdown ? tandem::config_defaults_markdown(section).c_str() : tandem::config_defaults_text().c_str(),
               stdout);
    return 0;
  }
  try {
    const tandem::LoadedConfig loaded = tandem::load_config({files, tandem::process_environment(), sets});
    if (*print) {
      std::fputs(tandem::config_to_yaml(loaded.config, no_sources ? nullptr : &loaded.source).c_str(), stdout);
    } else {
      std::printf("tandem-config: valid (%zu keys, %zu set by files, environment or --set)\n",
                  tandem::config_keys().size(), loaded.source.size());
    }
    return 0;
  } catch (const tandem::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
