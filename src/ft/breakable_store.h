// BreakableStore: the store a membership epoch's group is made over, whose waits end as
// soon as the epoch breaks. Making a group waits for every peer's address in the store, up
// to the group's timeout (30 s and more); a peer that will never come (it died, or joined
// a forged epoch: issue 46) would hold every other member there that long, while the
// decider waits for them to join again.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "datapar/rendezvous/store.h"

namespace datapar::ft::detail {

class BreakableStore : public Store {
 public:
  // `broken()`: whether the epoch broke (called from the waiting thread, a few times a second).
  BreakableStore(std::shared_ptr<Store> store, std::function<bool()> broken);

  void set(const std::string& key, const Bytes& value) override { store_->set(key, value); }
  // Waits as wait() does, then reads.
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return store_->compare_set(key, expected, desired);
  }
  // In short waits, until the keys exist (returns), `timeout` passes (TimeoutError) or the
  // epoch breaks (CommError).
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }
  bool delete_key(const std::string& key) override { return store_->delete_key(key); }
  int64_t num_keys() override { return store_->num_keys(); }
  std::string address() const override { return store_->address(); }
  // The underlying store's (a stall inspector's own connection need not break with the epoch).
  std::shared_ptr<Store> clone(std::chrono::milliseconds timeout) const override { return store_->clone(timeout); }
  using Store::set;
  using Store::wait;

 private:
  std::shared_ptr<Store> store_;
  std::function<bool()> broken_;
};

}  // namespace datapar::ft::detail
