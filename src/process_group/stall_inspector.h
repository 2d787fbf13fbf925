// StallInspector: notices a collective of one process group that has not completed after a
// while, and warns once, naming the ranks that have not issued it yet (Note [Stall
// inspection] in stall_inspector.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <memory>
#include <mutex>
#include <string>

#include "datapar/periodic_thread.h"
#include "datapar/process_group/work.h"
#include "datapar/rendezvous/store.h"

namespace datapar::detail {

class StallInspector {
 public:
  // `store`: a namespace of the job's store for this group alone; every member of the
  // group makes one. `warn_after` zero: no warnings (progress is still published).
  StallInspector(std::shared_ptr<Store> store, int rank, int size, std::chrono::milliseconds warn_after);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

  void set_warn_after(std::chrono::milliseconds after);

  // The group issued its next collective (every member issues them in one order).
  void issued(std::shared_ptr<Work> work);

  // For the oldest collective still pending, "rank(s) 1 (at 4) have not issued it yet";
  // when the job's store does not answer, that it does not and who serves it; "" when none
  // is pending or every rank has issued it. For a backend's error when a collective times
  // out.
  std::string ranks_behind();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    uint64_t number;  // 1 for the group's first collective
    std::shared_ptr<Work> work;
    Clock::time_point since;
  };

  // How long the thread waits between inspections: often enough that a warning sees fresh
  // counts, rarely enough to cost nothing.
  std::chrono::milliseconds period() const;
  // One inspection: warns about a stalled collective, publishes the count issued.
  void inspect();
  // The store this inspector reads and writes: a clone of store_ whose calls wait at most
  // a few seconds (Store::clone), made again after a call on it failed; store_ itself when
  // it has none. Throws what the store throws.
  std::shared_ptr<Store> probe();
  // Runs `call` on probe(); false (and the store counted silent from now, if it was not)
  // when it threw.
  template <typename Call>
  bool on_store(Call&& call);
  // The warning for collective `number`, stalled for `waited`, the others' counts read.
  std::string stall_message(const Pending& stalled, Clock::duration waited);
  // "the job's store at H:P has not answered for N s: ..." while it is silent, else "".
  std::string store_silence();
  // "1 (at 4), 3 (at 4)": the ranks whose published count is below `number`. Throws what
  // the store throws.
  std::string behind(uint64_t number);

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  std::atomic<int64_t> warn_after_ms_;

  std::mutex probe_mutex_;
  std::shared_ptr<Store> probe_;                // see probe()
  std::chrono::milliseconds probe_timeout_{0};  // the one probe_ was made with
  std::optional<Clock::time_point> silent_since_;  // the store's first failed call since it last answered

  std::mutex mutex_;
  uint64_t issued_ = 0;          // guarded by mutex_
  std::deque<Pending> pending_;  // issued, not yet seen completed, oldest first; guarded by mutex_
  // The inspecting thread's own:
  uint64_t published_ = 0;       // the count last published
  uint64_t warned_ = 0;          // the last collective warned about
  PeriodicThread thread_;        // last: started once the rest is ready, stopped before it goes
};

}  // namespace datapar::detail
