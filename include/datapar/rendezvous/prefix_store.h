// PrefixStore: a namespace inside another store. Every key is stored as "<prefix>/<key>",
// so that, e.g., process groups created one after another never see each other's keys.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "datapar/rendezvous/store.h"

namespace datapar {

class PrefixStore : public Store {
 public:
  // REQUIRES: store != nullptr. Shares (does not own exclusively) the underlying store.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  // The same namespace in a clone of the underlying store (null if it has none).
  std::shared_ptr<Store> clone(std::chrono::milliseconds timeout) const override;
  std::string address() const override { return store_->address(); }
  using Store::set;
  using Store::wait;

  const std::shared_ptr<Store>& underlying() const { return store_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace datapar
