// See store_exchange.h.
#include "collectives/store_exchange.h"

#include <algorithm>

#include "datapar/error.h"

namespace datapar::detail::shm {

StoreExchange::StoreExchange(std::shared_ptr<Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {}

std::vector<std::string> StoreExchange::all_gather(const std::string& mine, Clock::time_point deadline) {
  DATAPAR_INTERNAL_ASSERT(mine.size() <= kMaxText);
  const std::string round = str_cat(round_++, "/");
  store_->set(round + std::to_string(rank_), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(round + std::to_string(r));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  store_->wait(keys, std::max(left, std::chrono::milliseconds(1)));
  std::vector<std::string> texts;
  for (const std::string& key : keys) texts.push_back(store_->get_string(key));
  return texts;
}

}  // namespace datapar::detail::shm
