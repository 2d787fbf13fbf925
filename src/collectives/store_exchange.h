// An Exchange over a Store: each round, every member sets its key and reads the others'.
#pragma once

#include <memory>

#include "datapar/rendezvous/store.h"
#include "collectives/exchange.h"

namespace datapar::detail::shm {

class StoreExchange final : public Exchange {
 public:
  // `store`: a namespace of the job's store that this group's members alone use.
  StoreExchange(std::shared_ptr<Store> store, int rank, int size);

  std::vector<std::string> all_gather(const std::string& mine, Clock::time_point deadline) override;

 private:
  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  int round_ = 0;
};

}  // namespace datapar::detail::shm
