// Exchange: how the members of a group tell each other small facts while their shared
// memory is set up (shm_collectives.h). Over the group's Store (store_exchange.h) for Gloo;
// the MPI backend, whose groups may have no store, uses MPI itself.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace datapar::detail::shm {

using Clock = std::chrono::steady_clock;

class Exchange {
 public:
  virtual ~Exchange() = default;

  // Collective: every member calls it with its own text (at most kMaxText bytes) and gets
  // every member's, by rank. Throws TimeoutError when the others do not all answer by
  // `deadline`.
  virtual std::vector<std::string> all_gather(const std::string& mine, Clock::time_point deadline) = 0;

  static constexpr size_t kMaxText = 240;
};

}  // namespace datapar::detail::shm
