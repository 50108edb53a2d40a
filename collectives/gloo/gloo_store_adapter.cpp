#include "collectives/gloo/gloo_store_adapter.h"

#include "collectives/store_wait.h"

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

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  wait_for_keys(*store_, keys, timeout, what_, world_size_);
}

}  // namespace tandem::detail
