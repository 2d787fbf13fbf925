// See breakable_store.h.
#include "ft/breakable_store.h"

#include <algorithm>

#include "datapar/error.h"

namespace datapar::ft::detail {
namespace {

// How long one wait lasts before the epoch is looked at again.
constexpr std::chrono::milliseconds kSlice{200};

}  // namespace

BreakableStore::BreakableStore(std::shared_ptr<Store> store, std::function<bool()> broken)
    : Store(store->timeout()), store_(std::move(store)), broken_(std::move(broken)) {
  DATAPAR_CHECK(store_ != nullptr && broken_ != nullptr, "ft::BreakableStore: no store, or no test of the epoch.");
}

Bytes BreakableStore::get(const std::string& key) {
  wait({key}, timeout());
  return store_->get(key);
}

void BreakableStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      store_->wait(keys, std::clamp(left, std::chrono::milliseconds(1), kSlice));
      return;
    } catch (const TimeoutError&) {
      if (left <= kSlice) throw;
    }
    if (broken_()) {
      throw CommError("ft: the membership epoch broke while its group was being made (a member failed, left, or "
                      "never came); joining the next one.");
    }
  }
}

}  // namespace datapar::ft::detail
