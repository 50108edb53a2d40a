#include "collectives/gloo/gloo_store_adapter.h"

#include <tandem/base/errors.h>

#include <cctype>

namespace tandem::detail {

GlooStoreAdapter::GlooStoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string what,
                                   int world_size)
    : store_(std::move(store)), what_(std::move(what)), world_size_(world_size) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  auto value = store_->get(key);
  return std::vector<char>(value.begin(), value.end());
}

namespace {

// Gloo publishes one key per rank whose name ends in the rank number ("3", "rank_3"): the
// length of that numeric suffix, 0 if there is none.
size_t rank_suffix_length(const std::string& key) {
  size_t digits = key.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(key[digits - 1]))) --digits;
  return key.size() - digits;
}

}  // namespace

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  try {
    store_->wait(keys, timeout);
  } catch (const std::exception& e) {
    auto present = [&](const std::string& key) {
      try {
        return store_->check({key});
      } catch (const std::exception&) {
        return false;
      }
    };
    std::string missing;
    auto add = [&](const std::string& what) { missing += (missing.empty() ? "" : ", ") + what; };
    for (const auto& key : keys) {
      if (present(key)) continue;
      const size_t suffix = rank_suffix_length(key);
      if (suffix == 0) {
        add("key '" + key + "'");
        continue;
      }
      // Name every rank whose key is absent, not only the one Gloo happened to wait for.
      const std::string stem = key.substr(0, key.size() - suffix);
      for (int r = 0; r < world_size_; ++r) {
        if (!present(stem + std::to_string(r))) add("rank " + std::to_string(r));
      }
      break;
    }
    if (missing.empty()) missing = "unknown (store error: " + std::string(e.what()) + ")";
    throw TimeoutError("tandem: " + what_ + " timed out after " +
                       std::to_string(timeout.count()) + " ms: " + missing +
                       " never arrived. Check that every worker started, that all use the same "
                       "MASTER_ADDR/MASTER_PORT and WORLD_SIZE, and see the missing rank's log.");
  }
}

}  // namespace tandem::detail
