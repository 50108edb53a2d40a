// load_config and take_config_args (include/tandem/runtime/config.h): YAML files, TANDEM_*
// variables and --set overrides merged over the struct defaults, every problem collected.
#include "runtime/config/key_spec.h"

#include <tandem/runtime/dist_env.h>

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "base/launch_contract.h"

namespace tandem {
namespace {

using detail::find_spec;
using detail::KeySpec;
using detail::SetStatus;
using detail::specs;

std::string join_issues(const std::vector<ConfigIssue>& issues) {
  std::string out = "tandem: invalid configuration (" + std::to_string(issues.size()) +
                    (issues.size() == 1 ? " problem" : " problems") + "):";
  for (const auto& i : issues) out += "\n  " + i.message;
  return out;
}

// A key of a free app section: the program registered no app.* key, so any is accepted as text.
bool free_app_key(const std::string& key) {
  return key.size() > 4 && key.compare(0, 4, "app.") == 0 && !detail::app_keys_registered();
}

// True when `prefix` is a section or sub-section of some key ("ddp", "compression.powersgd").
bool is_section(const std::string& prefix) {
  if (prefix == "app" && !detail::app_keys_registered()) return true;
  for (const auto& s : specs())
    if (s.info.key.size() > prefix.size() && s.info.key.compare(0, prefix.size(), prefix) == 0 &&
        s.info.key[prefix.size()] == '.')
      return true;
  return false;
}

std::string first_key_under(const std::string& prefix) {
  for (const auto& s : specs())
    if (s.info.key.compare(0, prefix.size() + 1, prefix + ".") == 0) return s.info.key;
  return "";
}

// A TANDEM_<SECTION>_* name: one that must name a key.
bool looks_like_config(const std::string& name) {
  for (const auto& section : config_sections()) {
    const std::string prefix = detail::env_name(section) + "_";
    if (name.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

class Merger {
 public:
  Merger(Config& config, std::map<std::string, std::string>& source) : config_(config), source_(source) {}

  std::vector<ConfigIssue> issues;

  void add(const std::string& source, const std::string& key, const std::string& value, const std::string& what) {
    issues.push_back({source, key, value, source + ": " + what});
  }

  void unknown_key(const std::string& source, const std::string& key, const std::string& value) {
    const std::string hint = suggest_config_key(key);
    add(source, key, value,
        "unknown key '" + key + "' (value '" + value + "'); " +
            (hint.empty() ? std::string() : "did you mean '" + hint + "'? ") +
            "'tandem-config defaults' lists every key.");
  }

  // Sets `key` from `text`; `source` is where the text came from, `origin` what print shows.
  void set(const std::string& source, const std::string& origin, const std::string& key, const std::string& text) {
    const KeySpec* spec = find_spec(key);
    if (spec == nullptr && free_app_key(key)) {
      config_.app[key] = text;
      source_[key] = origin;
      return;
    }
    if (spec == nullptr) {
      if (is_section(key)) {
        add(source, key, text,
            "'" + key + "' is a section, not a key (value '" + text + "'); set one of its keys, e.g. '" +
                first_key_under(key) + "'.");
      } else {
        unknown_key(source, key, text);
      }
      return;
    }
    const detail::SetResult r = spec->set(config_, text);
    const ConfigKeyInfo& k = spec->info;
    switch (r.status) {
      case SetStatus::kOk:
        source_[key] = origin;
        return;
      case SetStatus::kType:
        add(source, key, text,
            key + " expects " + (k.type == "int" || k.type == "uint" ? "an " : "a ") + k.type + (k.allowed.empty() ? "" : " (" + k.allowed + ")") + ", got '" +
                text + "' (default " + k.default_value + ").");
        return;
      case SetStatus::kRange:
        add(source, key, text, key + " must be " + k.allowed + ", got '" + text + "' (default " + k.default_value + ").");
        return;
      case SetStatus::kChoice:
        add(source, key, text,
            key + " must be one of " + k.allowed + ", got '" + text + "'" +
                (r.suggestion.empty() ? "." : "; did you mean '" + r.suggestion + "'?"));
        return;
    }
  }

  void load_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      add(path, "", "", "cannot read the config file (" + std::string(std::strerror(errno)) +
                            "); check the --config path.");
      return;
    }
    std::stringstream text;
    text << in.rdbuf();
    YAML::Node root;
    try {
      root = YAML::Load(text.str());
    } catch (const YAML::Exception& e) {
      add(where(path, e.mark), "", "", "YAML syntax error: " + e.msg + ".");
      return;
    }
    if (root.IsNull()) return;  // an empty file sets nothing
    if (!root.IsMap()) {
      add(where(path, root.Mark()), "", "", "a config file must be a map of keys (e.g. 'ddp: {bucket_cap_mb: 10}').");
      return;
    }
    walk(path, root, "");
  }

  void load_env(const Environment& env) {
    std::map<std::string, const KeySpec*> by_env, by_alias;
    for (const auto& s : specs()) {
      by_env[s.info.env] = &s;
      if (!s.info.env_alias.empty()) by_alias[s.info.env_alias] = &s;
    }
    // Older names first, so the TANDEM_<KEY> name wins when both are set.
    for (const auto& [name, value] : env) {
      auto it = by_alias.find(name);
      if (it != by_alias.end()) set(name, name, it->second->info.key, value);
    }
    for (const auto& [name, value] : env) {
      auto it = by_env.find(name);
      if (it != by_env.end()) {
        set(name, name, it->second->info.key, value);
      } else if (name.size() > 11 && name.compare(0, 11, "TANDEM_APP_") == 0 && !detail::app_keys_registered()) {
        std::string leaf = name.substr(11);  // a free app section: TANDEM_APP_WARMUP -> app.warmup
        for (char& c : leaf) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        set(name, name, "app." + leaf, value);
      } else if (by_alias.count(name) == 0 && looks_like_config(name)) {
        std::vector<std::string> names;
        for (const auto& e : by_env) names.push_back(e.first);
        const std::string hint = detail::closest(name, names);
        add(name, "", value,
            "unknown config variable " + name + "='" + value + "'; " +
                (hint.empty() ? std::string() : "did you mean " + hint + " (" + by_env[hint]->info.key + ")? ") +
                "TANDEM_<SECTION>_* variables must name a key ('tandem-config defaults' lists them).");
      }
    }
  }

  // tandemrun --trace-dir gives workers TANDEM_TRACE_DIR only: a trace directory from the
  // launcher means "record", unless TANDEM_TRACE_ENABLED says otherwise.
  void imply_from_env(const Environment& env) {
    if (env.count("TANDEM_TRACE_DIR") != 0 && env.count("TANDEM_TRACE_ENABLED") == 0)
      set("TANDEM_TRACE_DIR", "TANDEM_TRACE_DIR", "trace.enabled", "true");
  }

  void load_set(const std::string& arg) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      add("--set " + arg, arg, "",
          "expected --set key=value (e.g. --set ddp.bucket_cap_mb=10), got '" + arg + "'.");
      return;
    }
    const std::string key = arg.substr(0, eq);
    set("--set " + arg, "--set", key, arg.substr(eq + 1));
  }

 private:
  static std::string where(const std::string& path, const YAML::Mark& m) {
    if (m.is_null()) return path;
    return path + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  }

  static std::string describe(const YAML::Node& n) {
    if (n.IsMap()) return "<a map>";
    if (n.IsSequence()) return "<a list>";
    if (n.IsScalar()) return n.Scalar();
    return "";
  }

  void walk(const std::string& path, const YAML::Node& map, const std::string& prefix) {
    for (const auto& kv : map) {
      const YAML::Node& k = kv.first;
      const YAML::Node& v = kv.second;
      if (!k.IsScalar()) {
        add(where(path, k.Mark()), "", "", "keys must be plain names, got a " +
                                               std::string(k.IsMap() ? "map" : "list") + " as a key.");
        continue;
      }
      const std::string key = prefix + k.Scalar();
      const KeySpec* spec = find_spec(key);
      if (v.IsMap()) {
        if (spec != nullptr) {
          add(where(path, v.Mark()), key, "<a map>", key + " expects a " + spec->info.type + ", got a map.");
        } else if (is_section(key) || free_app_key(key)) {
          walk(path, v, key + ".");
        } else {
          unknown_key(where(path, k.Mark()), key, "<a map>");
        }
        continue;
      }
      if (spec == nullptr) {
        if (free_app_key(key)) {
          set(where(path, v.Mark()), where(path, v.Mark()), key, describe(v));
        } else if (is_section(key)) {
          set(where(path, v.Mark()), "", key, describe(v));
        } else {
          unknown_key(where(path, k.Mark()), key, describe(v));
        }
        continue;
      }
      const std::string origin = where(path, v.Mark());
      if (v.IsSequence()) {
        if (!spec->is_list) {
          add(origin, key, "<a list>", key + " expects a " + spec->info.type + ", got a list.");
          continue;
        }
        std::string text = "[";
        bool scalars = true;
        for (std::size_t i = 0; i < v.size(); ++i) {
          scalars = scalars && v[i].IsScalar();
          text += (i ? ", " : "") + describe(v[i]);
        }
        text += "]";
        if (!scalars) {
          add(origin, key, text, key + " expects a " + spec->info.type + ", got a list holding lists or maps.");
          continue;
        }
        set(origin, origin, key, text);
      } else if (v.IsNull()) {
        // `key:` with nothing after it: empty for strings and lists, an error otherwise.
        if (spec->info.type == "string" || spec->is_list) {
          set(origin, origin, key, "");
        } else {
          add(origin, key, "", key + " expects a " + spec->info.type + ", got nothing.");
        }
      } else {
        set(origin, origin, key, v.Scalar());
      }
    }
  }

  Config& config_;
  std::map<std::string, std::string>& source_;
};

}  // namespace

InvalidConfigError::InvalidConfigError(std::vector<ConfigIssue> issues)
    : ConfigError(join_issues(issues)), issues_(std::move(issues)) {}

Environment process_environment() { return launch::environment(); }

std::shared_ptr<GradCodec> Config::make_codec() const {
  const CompressionConfig& c = compression;
  std::shared_ptr<GradCodec> codec;
  std::string wire = c.wire;
  if (c.codec == "average") {
    if (wire == "fp32") return nullptr;  // DistributedDataParallel's own average all-reduce
    codec = make_average_codec();
  } else if (c.codec == "fp16" || c.codec == "bf16") {
    if (wire != "fp32" && wire != c.codec) {
      throw ConfigError("compression.codec = " + c.codec + " cannot take compression.wire = " + wire +
                        "; use compression.codec = " + wire + " (or wire fp32).");
    }
    wire = c.codec;
    codec = make_average_codec();
  } else if (c.codec == "auto") {
    AutoOptions o = c.automatic;
    o.wire = wire == "fp16" ? at::kHalf : at::kBFloat16;  // fp32: the default cast, bf16
    return make_auto_codec(o);
  } else if (c.codec == "powersgd") {
    codec = make_powersgd_codec(c.powersgd);
  } else if (c.codec == "topk") {
    codec = make_topk_codec(c.topk);
  } else if (c.codec == "sign") {
    codec = make_sign_codec(c.sign);
  } else {
    throw ConfigError("compression.codec = '" + c.codec +
                      "' is not a codec; use average, fp16, bf16, auto, powersgd, topk or sign.");
  }
  if (wire == "fp16") return make_cast_codec(at::kHalf, codec);
  if (wire == "bf16") return make_cast_codec(at::kBFloat16, codec);
  if (wire == "fp32") return codec;
  throw ConfigError("compression.wire = '" + wire + "' is not fp32, fp16 or bf16.");
}

GradScalerOptions Config::scaler_options() const {
  GradScalerOptions o = precision.scaler;
  const bool fp16 = precision.autocast == at::kHalf || ddp.mixed_precision.param_dtype == at::kHalf;
  o.enabled = precision.scaler_mode == PrecisionConfig::Scaler::kOn ||
              (precision.scaler_mode == PrecisionConfig::Scaler::kAuto && fp16);
  return o;
}

LoadedConfig load_config(const ConfigInputs& inputs) {
  LoadedConfig out;
  Merger merger(out.config, out.source);
  for (const auto& f : inputs.files) merger.load_file(f);
  merger.load_env(inputs.env);
  merger.imply_from_env(inputs.env);
  for (const auto& s : inputs.sets) merger.load_set(s);

  Config& c = out.config;
  if (merger.issues.empty()) {
    try {
      c.ddp.codec = c.make_codec();
    } catch (const ConfigError& e) {
      const auto it = out.source.find("compression.codec");
      merger.add(it == out.source.end() ? "compression.codec (default)" : it->second, "compression.codec",
                 c.compression.codec, e.what());
    }
  }
  try {
    c.comm.env = DistEnv::from_env([&](const char* name) -> const char* {
      auto it = inputs.env.find(name);
      return it == inputs.env.end() ? nullptr : it->second.c_str();
    });
    // As InitOptions::from_env: a store prefix distinct per run and restart.
    if (!c.comm.env.run_id.empty()) c.comm.store_prefix = "tandem/" + c.comm.env.run_id;
    c.comm.store_prefix += "/restart" + std::to_string(c.comm.env.restart_count);
  } catch (const ConfigError& e) {
    merger.add("launcher environment", "", "", e.what());
  }
  if (!merger.issues.empty()) throw InvalidConfigError(std::move(merger.issues));
  return out;
}

InitOptions load_comm_config(const Environment& env) {
  // Every other section's variables are left out: init() alone must not fail on a key that a
  // Context would read, and check, later.
  std::set<std::string> others;
  for (const auto& s : specs()) {
    if (s.info.key.compare(0, 5, "comm.") == 0) continue;
    others.insert(s.info.env);
    if (!s.info.env_alias.empty()) others.insert(s.info.env_alias);
  }
  const std::string comm = detail::env_name("comm") + "_";
  ConfigInputs inputs;
  for (const auto& [name, value] : env) {
    const bool other_section = looks_like_config(name) && name.compare(0, comm.size(), comm) != 0;
    if (others.count(name) == 0 && !other_section) inputs.env.emplace(name, value);
  }
  return load_config(inputs).config.comm;
}

ConfigArgs take_config_args(int& argc, char** argv) {
  ConfigArgs args;
  if (argc < 1) return args;
  // After "--" everything is the program's: CLI11 only sees what comes before.
  int end = 1;
  while (end < argc && std::string(argv[end]) != "--") ++end;
  CLI::App app;
  app.set_help_flag();  // --help is the program's
  app.allow_extras();   // so is every flag that is not ours, in order
  app.add_option("--config", args.files)->allow_extra_args(false);
  app.add_option("--set", args.sets)->allow_extra_args(false);
  app.add_flag("--print-config", args.print_config);
  app.add_flag("--help-config", args.help_config);
  std::vector<std::string> words(argv + 1, argv + end);
  std::reverse(words.begin(), words.end());  // CLI11 takes the words last-first
  try {
    app.parse(words);
  } catch (const CLI::ArgumentMismatch& e) {  // --config or --set last, without its value
    const std::string flag =
        std::string(e.what()).rfind("--config", 0) == 0 ? "--config" : "--set";
    throw InvalidConfigError({{flag, "", "", flag + ": missing value (" + flag +
                                                 (flag == "--config" ? " FILE.yaml)." : " key=value).")}});
  } catch (const CLI::ParseError& e) {  // e.g. --print-config=maybe
    throw InvalidConfigError({{"command line", "", "", "command line: " + std::string(e.what()) +
                                                            "; the tandem flags are --config FILE, "
                                                            "--set key=value, --print-config and "
                                                            "--help-config."}});
  }
  // Keep the program's words (the very strings of argv, in their order) and everything from "--".
  int kept = 1, next = 1;
  for (const std::string& word : app.remaining()) {
    while (next < end && word != argv[next]) ++next;
    argv[kept++] = argv[next++];
  }
  for (int i = end; i < argc; ++i) argv[kept++] = argv[i];
  argc = kept;
  argv[argc] = nullptr;
  return args;
}

}  // namespace tandem
