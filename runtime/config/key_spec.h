// Internal: the registry's entries with their setters and getters (runtime/config/registry.cpp),
// and the text helpers the loader and printer share.
#pragma once

#include <tandem/runtime/config_keys.h>

#include <functional>
#include <string>
#include <vector>

namespace tandem::detail {

// Why a value was refused.
enum class SetStatus { kOk, kType, kRange, kChoice };

struct SetResult {
  SetStatus status = SetStatus::kOk;
  std::string suggestion;  // for kChoice: the closest valid choice, or ""
};

struct KeySpec;

struct KeySpec {
  ConfigKeyInfo info;
  bool is_list = false;
  std::vector<std::string> choices;  // for type "choice"
  // Parses `text` into the member. List keys take "1,2,3" or "[1, 2, 3]".
  std::function<SetResult(Config&, const std::string& text)> set;
  std::function<std::string(const Config&)> get;  // list keys print "[1, 2, 3]"
};

const std::vector<KeySpec>& specs();
const KeySpec* find_spec(const std::string& key);
// Appends a registered app.* key (env name filled in); ConfigError for a duplicate. Bumps
// registry_generation, which the cached key and section lists compare against.
void add_app_spec(KeySpec spec);
extern int registry_generation;
// True when the program registered app.* keys (then only those are accepted).
bool app_keys_registered();

// "ddp.bucket_cap_mb" -> "TANDEM_DDP_BUCKET_CAP_MB".
std::string env_name(const std::string& key);
// The closest of `candidates` to `word` within a distance that still looks like a typo, or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace tandem::detail
