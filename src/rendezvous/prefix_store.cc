// PrefixStore. See prefix_store.h.
#include "datapar/rendezvous/prefix_store.h"

#include "datapar/error.h"

namespace datapar {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultTimeout), prefix_(std::move(prefix)), store_(std::move(store)) {
  DATAPAR_CHECK(store_ != nullptr, "PrefixStore \"", prefix_, "\": the underlying store is null.");
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(full(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { store_->set(full(key), value); }

Bytes PrefixStore::get(const std::string& key) {
  // Wait here with our own timeout, then read.
  store_->wait({full(key)}, timeout());
  return store_->get(full(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return store_->add(full(key), delta); }

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return store_->compare_set(full(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  store_->wait(full(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(full(keys)); }

bool PrefixStore::delete_key(const std::string& key) { return store_->delete_key(full(key)); }

int64_t PrefixStore::num_keys() { return store_->num_keys(); }

std::shared_ptr<Store> PrefixStore::clone(std::chrono::milliseconds timeout) const {
  std::shared_ptr<Store> base = store_->clone(timeout);
  return base ? std::make_shared<PrefixStore>(prefix_, std::move(base)) : nullptr;
}

}  // namespace datapar
