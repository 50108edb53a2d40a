// The registry's public face (include/tandem/runtime/config_keys.h): key list, suggestions,
// and the printed forms (effective YAML, defaults as text and as Markdown tables).
#include "base/strings.h"
#include "runtime/config/key_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>

namespace tandem {
namespace {

using detail::specs;

std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }
std::string leaf_of(const std::string& key) { return key.substr(key.rfind('.') + 1); }

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// One value: strings double-quoted (so "", "null" or "1" stay strings), lists as flow sequences
// ("[1, 2]"), everything else plain.
void emit_value(YAML::Emitter& out, const detail::KeySpec& s, const std::string& v) {
  if (s.info.type == "string") {
    out << YAML::DoubleQuoted << v;
  } else if (s.is_list) {
    const std::string list = strings::trim(v);  // the getter prints "[1, 2]"
    const std::string items = list.size() >= 2 ? list.substr(1, list.size() - 2) : list;
    out << YAML::Flow << YAML::BeginSeq;
    if (!strings::trim(items).empty()) {
      for (const auto& item : strings::split(items, ',')) out << strings::trim(item);
    }
    out << YAML::EndSeq;
  } else {
    out << v;
  }
}

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string env_text(const ConfigKeyInfo& k) {
  return k.env_alias.empty() ? k.env : k.env + " (or " + k.env_alias + ")";
}

}  // namespace

const std::vector<ConfigKeyInfo>& config_keys() {
  static std::vector<ConfigKeyInfo> keys;
  static int generation = -1;
  if (generation != detail::registry_generation) {
    keys.clear();
    for (const auto& s : specs()) keys.push_back(s.info);
    generation = detail::registry_generation;
  }
  return keys;
}

const std::vector<std::string>& config_sections() {
  static std::vector<std::string> sections;
  static int generation = -1;
  if (generation != detail::registry_generation) {
    sections.clear();
    for (const auto& s : specs()) {
      const std::string sec = section_of(s.info.key);
      if (std::find(sections.begin(), sections.end(), sec) == sections.end()) sections.push_back(sec);
    }
    // The program's own section is always known (free when no app key is registered).
    if (std::find(sections.begin(), sections.end(), "app") == sections.end()) sections.push_back("app");
    generation = detail::registry_generation;
  }
  return sections;
}

std::string config_value(const Config& config, const std::string& key) {
  const auto* s = detail::find_spec(key);
  if (s == nullptr) {
    const std::string hint = suggest_config_key(key);
    throw ConfigError("tandem: no config key '" + key + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
  }
  return s->get(config);
}

std::string suggest_config_key(const std::string& key) {
  std::vector<std::string> all, same_section, same_leaf;
  std::string section = key.find('.') == std::string::npos ? "" : section_of(key);
  const std::string leaf = leaf_of(key);
  // A misspelt section ("dpp.find_unused_parameters") is read as the section it resembles.
  const auto& sections = config_sections();
  if (!section.empty() && std::find(sections.begin(), sections.end(), section) == sections.end()) {
    if (const std::string s = detail::closest(section, sections); !s.empty()) section = s;
  }
  for (const auto& s : specs()) {
    const std::string& k = s.info.key;
    all.push_back(k);
    if (section_of(k) == section) same_section.push_back(k);
    if (leaf_of(k) == leaf) same_leaf.push_back(k);
  }
  const std::string corrected = section.empty() ? key : section + key.substr(key.find('.'));
  // A typo inside the right section ("ddp.bucket_cap" -> "ddp.bucket_cap_mb").
  if (const std::string s = detail::closest(corrected, same_section); !s.empty()) return s;
  // A name cut short ("ddp.find_unused" -> "ddp.find_unused_parameters").
  std::vector<std::string> longer;
  for (const auto& k : same_section) {
    if (leaf.size() >= 4 && strings::starts_with(leaf_of(k), leaf)) longer.push_back(k);
  }
  if (longer.size() == 1) return longer[0];
  // The right name in the wrong or a missing section ("bucket_cap_mb" -> "ddp.bucket_cap_mb").
  if (same_leaf.size() == 1) return same_leaf[0];
  return detail::closest(key, all);
}

std::string config_to_yaml(const Config& config, const std::map<std::string, std::string>* sources) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the maps we are inside
  // The registered keys, then a free app section's keys (no spec: printed as text).
  std::vector<std::pair<std::string, const detail::KeySpec*>> entries;
  for (const auto& s : specs()) entries.emplace_back(s.info.key, &s);
  if (!detail::app_keys_registered()) {
    for (const auto& [key, value] : config.app) entries.emplace_back(key, nullptr);
  }
  static const detail::KeySpec kFreeText = [] {
    detail::KeySpec t;
    t.info.type = "string";
    return t;
  }();
  for (const auto& [key, spec] : entries) {
    const detail::KeySpec& s = spec != nullptr ? *spec : kFreeText;
    const auto parts = strings::split(key, '.');
    if (!open.empty() && open.front() != parts.front()) out << YAML::Newline;  // between sections
    std::size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    for (; open.size() > common; open.pop_back()) out << YAML::EndMap;
    for (std::size_t i = common; i + 1 < parts.size(); ++i) {
      out << YAML::Key << parts[i] << YAML::Value << YAML::BeginMap;
      open.push_back(parts[i]);
    }
    out << YAML::Key << parts.back() << YAML::Value;
    emit_value(out, s, spec != nullptr ? s.get(config) : config.app.at(key));
    if (sources != nullptr) {
      const auto it = sources->find(key);
      out << YAML::Comment(it == sources->end() ? std::string("default") : it->second);
    }
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string config_defaults_text() {
  std::string out;
  for (const auto& k : config_keys()) {
    out += k.key + " = " + (k.type == "string" ? quoted(k.default_value) : k.default_value) + "\n";
    out += "    " + k.type + (k.allowed.empty() ? "" : ", " + k.allowed) + "; env " + env_text(k) + "\n";
    out += "    " + k.doc + "\n";
  }
  return out;
}

std::string config_defaults_markdown(const std::string& section) {
  std::string out;
  std::string current;
  for (const auto& k : config_keys()) {
    const std::string sec = section_of(k.key);
    if (!section.empty() && sec != section) continue;
    if (sec != current) {
      if (!out.empty()) out += "\n";
      out += "### `" + sec + "`\n\n| key | type | default | allowed | environment | doc |\n|---|---|---|---|---|---|\n";
      current = sec;
    }
    const std::string def = k.type == "string" ? quoted(k.default_value) : k.default_value;
    out += "| `" + k.key + "` | " + k.type + " | `" + md_cell(def) + "` | " + md_cell(k.allowed) + " | `" + k.env +
           "`" + (k.env_alias.empty() ? "" : " (or `" + k.env_alias + "`)") + " | " + md_cell(k.doc) + " |\n";
  }
  return out;
}

}  // namespace tandem
