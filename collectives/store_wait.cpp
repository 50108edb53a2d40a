#include "collectives/store_wait.h"

#include <tandem/base/errors.h>

#include <cctype>

namespace tandem::detail {
namespace {

// The length of a key's numeric suffix ("rank_3": 1), 0 if there is none.
size_t rank_suffix_length(const std::string& key) {
  size_t digits = key.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(key[digits - 1]))) --digits;
  return key.size() - digits;
}

}  // namespace

void wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const std::string& what, int world_size) {
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    auto present = [&](const std::string& key) {
      try {
        return store.check({key});
      } catch (const std::exception&) {
        return false;
      }
    };
    std::string missing;
    auto add = [&](const std::string& who) { missing += (missing.empty() ? "" : ", ") + who; };
    for (const auto& key : keys) {
      if (present(key)) continue;
      const size_t suffix = rank_suffix_length(key);
      if (suffix == 0) {
        add("key '" + key + "'");
        continue;
      }
      // Name every rank whose key is absent, not only the one the store waited for.
      const std::string stem = key.substr(0, key.size() - suffix);
      for (int r = 0; r < world_size; ++r) {
        if (!present(stem + std::to_string(r))) add("rank " + std::to_string(r));
      }
      break;
    }
    if (missing.empty()) missing = "unknown (store error: " + std::string(e.what()) + ")";
    throw TimeoutError("tandem: " + what + " timed out after " + std::to_string(timeout.count()) +
                       " ms: " + missing +
                       " never arrived. Check that every worker started, that all use the same "
                       "MASTER_ADDR/MASTER_PORT and WORLD_SIZE, and see the missing rank's log.");
  }
}

}  // namespace tandem::detail
