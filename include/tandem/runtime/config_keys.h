// The config key registry: one entry per key (dotted name, type, default, allowed values, doc,
// environment variable, and the Config member it sets). It is the single source of truth for
// parsing, validation, printing and the key tables in docs/ (`tandem-config defaults --markdown`).
//
// Environment mapping: "ddp.bucket_cap_mb" <-> TANDEM_DDP_BUCKET_CAP_MB (upper case, '.' -> '_';
// the registry guarantees no two keys map to one name). A few keys also accept an older variable
// (TANDEM_TIMEOUT_S, TANDEM_SHM, TANDEM_GLOO_HOSTNAME, TANDEM_GLOO_IFNAME). A TANDEM_ variable
// whose name starts with a section (TANDEM_DDP_, TANDEM_COMM_, ...) but names no key is an error;
// other TANDEM_ variables (TANDEM_HEARTBEAT_FILE, test switches) are not config and are ignored.
// Ownership: the registry is built once, owned by the library and lives for the process; returned
// references into it stay valid until the next register_app_key(). Thread-safety: immutable after first use; all functions are
// reentrant. Errors: config_value() throws ConfigError for a key that does not exist (with the
// closest key as a hint); the printers throw nothing.
#pragma once

#include <tandem/runtime/config.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tandem {

struct ConfigKeyInfo {
  std::string key;        // "ddp.bucket_cap_mb"
  std::string type;       // bool | int | uint | float | string | bytes | choice | list<int>
  std::string default_value;  // printed from a default-constructed Config
  std::string allowed;    // "> 0", "[0, 1]", "gpipe | 1f1b | ..." ("" = any value of the type)
  std::string doc;        // one line
  std::string env;        // TANDEM_DDP_BUCKET_CAP_MB
  std::string env_alias;  // an older variable for the same key, or ""
};

// Registers a key of the program's own in section `app` ("app.hidden"), before run_main() (or
// load_config) reads the config: it then merges from YAML, TANDEM_APP_* and --set, is validated,
// printed, listed by --help-config and suggested for typos like tandem's own keys. T is int64_t,
// double, bool or std::string; `valid` (optional) accepts a parsed value, and `allowed` says in
// words what it accepts ("> 0"). Once any app key is registered, unregistered app.* keys are
// errors; with none registered, the app section is free (any app.* key, as text). Read values with
// Config::app_value<T>(key). Throws ConfigError for a name outside `app.`, a key registered twice,
// or a default that `valid` refuses. Not thread-safe: register from main() before loading.
template <class T>
void register_app_key(const std::string& key, T default_value, const std::string& doc,
                      std::function<bool(const T&)> valid = {}, const std::string& allowed = "");

// Every key, in documentation order (grouped by section).
const std::vector<ConfigKeyInfo>& config_keys();
// The sections ("comm", "ddp", ...) in documentation order.
const std::vector<std::string>& config_sections();

// Value of `key` in `config`, printed as the YAML/--set text that sets it. Throws ConfigError
// for an unknown key.
std::string config_value(const Config& config, const std::string& key);

// The closest registered key to `key` (edit distance, section-aware), or "" when none is close.
std::string suggest_config_key(const std::string& key);

// The effective config as nested YAML that load_config reads back to the same values. With
// `sources`, each line ends with "# <source>".
std::string config_to_yaml(const Config& config,
                           const std::map<std::string, std::string>* sources = nullptr);
// Every key: name, type, default, allowed values, environment variable, doc (plain text).
std::string config_defaults_text();
// One Markdown table per section ("### ddp" + | key | type | default | allowed | env | doc |).
// `section` non-empty: that section's table only.
std::string config_defaults_markdown(const std::string& section = "");

}  // namespace tandem
