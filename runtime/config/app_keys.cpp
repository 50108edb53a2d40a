// The program's own config keys, section `app` (register_app_key in config_keys.h, and
// Config::app_value in config.h): typed, validated, merged like tandem's keys; values kept as text
// in Config::app.
#include "base/strings.h"
#include "runtime/config/key_builders.h"
#include "runtime/config/key_spec.h"

#include <tandem/base/errors.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

namespace {

template <class T>
const char* type_name();
template <>
const char* type_name<int64_t>() { return "int"; }
template <>
const char* type_name<double>() { return "float"; }
template <>
const char* type_name<bool>() { return "bool"; }
template <>
const char* type_name<std::string>() { return "string"; }

template <class T>
std::optional<T> parse(const std::string& text);
template <>
std::optional<int64_t> parse<int64_t>(const std::string& text) { return strings::parse_int(strings::trim(text)); }
template <>
std::optional<double> parse<double>(const std::string& text) {
  auto v = strings::parse_double(strings::trim(text));
  if (v && !std::isfinite(*v)) return std::nullopt;
  return v;
}
template <>
std::optional<bool> parse<bool>(const std::string& text) {
  const std::string t = strings::trim(text);
  if (t == "true") return true;
  if (t == "false") return false;
  return std::nullopt;
}
template <>
std::optional<std::string> parse<std::string>(const std::string& text) { return text; }

template <class T>
std::string text_of(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return detail::num_text(v);
  } else {
    return std::to_string(v);
  }
}

}  // namespace

bool detail::app_keys_registered() {
  for (const auto& s : specs()) {
    if (s.info.key.compare(0, 4, "app.") == 0) return true;
  }
  return false;
}

template <class T>
void register_app_key(const std::string& key, T default_value, const std::string& doc,
                      std::function<bool(const T&)> valid, const std::string& allowed) {
  if (key.size() <= 4 || key.compare(0, 4, "app.") != 0 || key.back() == '.') {
    throw ConfigError("tandem: register_app_key: '" + key + "' is not in the program's section; "
                      "name it app.<name> (e.g. app.hidden).");
  }
  if (valid && !valid(default_value)) {
    throw ConfigError("tandem: register_app_key: the default of " + key + " (" + text_of(default_value) +
                      ") is not " + (allowed.empty() ? std::string("accepted by its check") : allowed) + ".");
  }
  detail::KeySpec s;
  s.info.key = key;
  s.info.type = type_name<T>();
  s.info.default_value = text_of(default_value);
  s.info.allowed = allowed;
  s.info.doc = doc;
  const std::string fallback = s.info.default_value;
  s.set = [key, valid](Config& c, const std::string& text) -> detail::SetResult {
    const std::optional<T> v = parse<T>(text);
    if (!v) return {detail::SetStatus::kType, ""};
    if (valid && !valid(*v)) return {detail::SetStatus::kRange, ""};
    c.app[key] = text_of(*v);
    return {};
  };
  s.get = [key, fallback](const Config& c) {
    const auto it = c.app.find(key);
    return it == c.app.end() ? fallback : it->second;
  };
  detail::add_app_spec(std::move(s));
}

template <class T>
T Config::app_value(const std::string& key) const {
  std::string text;
  if (const auto it = app.find(key); it != app.end()) {
    text = it->second;
  } else if (const auto* spec = detail::find_spec(key)) {
    text = spec->info.default_value;
  } else {
    const std::string hint = key.compare(0, 4, "app.") == 0 ? suggest_config_key(key) : "";
    throw ConfigError("tandem: config key '" + key + "' was neither set nor registered" +
                      (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                      " Register it with tandem::register_app_key before run_main.");
  }
  const std::optional<T> v = parse<T>(text);
  if (!v) {
    throw ConfigError("tandem: config key '" + key + "' is '" + text + "', not a " + type_name<T>() +
                      " (--set " + key + "=...).");
  }
  return *v;
}

#define TANDEM_APP_TYPE(T)                                                                        \
  template void register_app_key<T>(const std::string&, T, const std::string&,                   \
                                    std::function<bool(const T&)>, const std::string&);          \
  template T Config::app_value<T>(const std::string&) const;
TANDEM_APP_TYPE(int64_t)
TANDEM_APP_TYPE(double)
TANDEM_APP_TYPE(bool)
TANDEM_APP_TYPE(std::string)
#undef TANDEM_APP_TYPE

}  // namespace tandem
