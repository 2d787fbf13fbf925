// The membership decider of a fault-tolerant job (issue 31, docs/fault_tolerance.md): one
// thread, in one process that is not a rank (the launcher that hosts the store), decides
// every membership epoch, so two epochs never form at once and any rank may die.
//
// Store keys, under "ft/<run>/":
//   hb/<id>        a member's heartbeat counter (Member's thread adds 1 per interval)
//   joins, join/N  join requests, numbered: "<id> <committed step>", and in replica groups
//                  " <group> <index> <members per group>"
//   epoch/<E>      epoch E's record (Membership::encode), written once; epoch: the newest E
//   broken/<E>     set when a member of E is evicted, or joins again (its step failed): the
//                  others abort and join again
//   grow/<E>       set when a new member waits: the members join again at a step boundary
//   evicted/<id>   set when a member is evicted (a stopped process learns it on resuming)
//   finished       set by a member that finished the training (Member::finished): once
//                  every member is gone, a newcomer is told the training is complete
//   deaths, death/N  members reported dead by a process that saw them die (their launcher,
//                  report_dead()): evicted at once, without waiting for their heartbeat
//                  to go stale
//
// An epoch forms when every live member of the last one has joined again, with at least
// min_members, at most max_members (the last epoch's members first, in their old order,
// then newcomers in join order); newcomers get settle_time for others to follow. In a job of
// replica groups (FtOptions::replica_group_size) an epoch takes whole groups only, in group
// and slot order: a member whose group is not whole waits, pending, and counts for nothing
// (no growth, no quorum) until a member for every slot of its group asks to join. A member
// whose heartbeat stops for eviction_timeout is evicted. Without a quorum within
// quorum_timeout, the decider publishes a stop (members' join() throws the reason).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "datapar/ft/membership/membership.h"
#include "datapar/periodic_thread.h"
#include "datapar/rendezvous/store.h"

namespace datapar::ft {

class Decider {
 public:
  // Starts deciding for job `run` on `store` (its own connection: the decider's calls must
  // not queue behind another thread's).
  Decider(std::shared_ptr<Store> store, const std::string& run, FtOptions options = {});
  ~Decider();
  Decider(const Decider&) = delete;
  Decider& operator=(const Decider&) = delete;

  // The newest epoch published (number 0: none yet).
  Membership epoch() const;
  // Why it stopped the job; "" while the job goes on.
  std::string stop_reason() const;
  // Whether that verdict is that the training is complete (a member finished it; a worker
  // that joins now has nothing to do): not a failure.
  bool training_complete() const;

 private:
  struct Pending {
    std::string id;
    int64_t step = 0;
    ReplicaSlot slot;
  };
  struct Seen {
    int64_t beats = -1;
    std::chrono::steady_clock::time_point changed;
  };

  // One round: reads joins, deaths and heartbeats, and decides. False once a verdict ended
  // the job.
  bool decide_once();
  // Reads the records `item`1, `item`2, ... that `counter` numbers, from the one after
  // `read` on, handing each to `take`.
  void read_numbered(const std::string& counter, const std::string& item, int64_t& read,
                     const std::function<void(const std::string& key, const std::string& record)>& take);
  void read_joins();
  void read_deaths();
  void read_heartbeats();
  void evict(const std::string& id);
  // The pending members an epoch may take: all, or those of whole replica groups.
  std::vector<Pending> admissible() const;
  // The epoch after the current one, of `ready` (admissible()'s), `most` members at most.
  Membership next_epoch(const std::vector<Pending>& ready, int most) const;
  void decide();
  void publish(Membership epoch);

  std::shared_ptr<Store> store_;
  FtOptions options_;

  // The decider thread's own state.
  int64_t joins_read_ = 0, deaths_read_ = 0;
  std::vector<Pending> pending_;
  std::map<std::string, Seen> seen_;
  std::set<std::string> evicted_;
  int group_size_ = 1;  // members per replica group: the options', or the first join's (0: none yet)
  bool grow_signalled_ = false;
  std::chrono::steady_clock::time_point first_pending_, last_join_, started_;
  std::string last_error_;  // the store's last error, said once

  mutable std::mutex mutex_;
  Membership current_;            // guarded by mutex_
  std::string stop_reason_;  // guarded by mutex_
  bool complete_ = false;    // guarded by mutex_

  datapar::detail::PeriodicThread thread_;  // last: stopped before the state it reads goes
};

// Tells the decider of job `run` on `store` that member `id` is dead (its process exited):
// it is evicted at once. For the process that saw it die, e.g. its launcher; a member that
// is only slow must not be reported (the heartbeat judges those).
void report_dead(std::shared_ptr<Store> store, const std::string& run, const std::string& id);

}  // namespace datapar::ft
