// A member of a fault-tolerant job (issue 31, docs/fault_tolerance.md): one per rank
// process. It renews a heartbeat in the store from a thread of its own (so that a process
// stopped by a signal stops renewing it too), joins membership epochs that the decider
// (decider.h) forms, and tells the training loop whether it may commit a step.
//
//   ft::Member me(store, "run-7", options);
//   ft::Membership epoch = me.join(/*committed_step=*/0);  // waits for an epoch that holds it
//   ... each step: train; the vote includes me.may_commit() and me.reconfigure_wanted() ...
//   ... on a failed or reconfiguring step: epoch = me.join(step);
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "datapar/ft/membership/membership.h"
#include "datapar/periodic_thread.h"
#include "datapar/rendezvous/store.h"

namespace datapar::ft {

class Member {
 public:
  // `run`: the job's name in the store (members and decider of one job share it). Starts
  // the heartbeat. The store's own timeout bounds each call; `store` must be able to clone
  // a connection for the heartbeat thread (TcpStore) or be safe to share between threads.
  // `slot`: this member's place in its replica group, when the job has them
  // (FtOptions::replica_group_size > 1).
  Member(std::shared_ptr<Store> store, const std::string& run, FtOptions options = {}, ReplicaSlot slot = {});
  ~Member();
  Member(const Member&) = delete;
  Member& operator=(const Member&) = delete;

  // This process's incarnation id (random; never reused).
  const std::string& id() const { return id_; }
  const ReplicaSlot& slot() const { return slot_; }

  // Asks to be a member of the next epoch, having committed `committed_step`, and waits
  // (at most the quorum timeout) until the decider publishes an epoch that holds it, which
  // it returns. Throws MembershipError when the decider stops the job (below the minimum),
  // when no epoch forms in time, or when the store is gone (the host of the decider died);
  // TrainingComplete when a member already finished the training (see finished()).
  Membership join(int64_t committed_step);

  // The training is complete: says so in the store, so that a replacement that asks to
  // join later is told (TrainingComplete) rather than that every member is gone.
  void finished();

  // The epoch last joined (number 0: none yet).
  Membership epoch() const;

  // Whether this member may commit a step of its epoch: its heartbeat was renewed within
  // half the eviction timeout (a process that was stopped longer may have been evicted, and
  // must not commit on its own), it was not evicted, and its epoch is not broken.
  bool may_commit() const;

  // The current epoch lost a member (evicted by the decider): its collectives will fail or
  // hang, and every member must join again.
  bool epoch_broken() const;

  // A member waits to join: the members should join again at the next step boundary (a
  // decision the training loop takes together, in its per-step vote).
  bool newcomer_waiting() const;

  // Called on the heartbeat thread, once per epoch, with the epoch's number, when the
  // epoch is broken: to abort that epoch's process group, so that collectives blocked on
  // the lost member fail at once (the number tells it from a newer epoch's group, which
  // join() may have made meanwhile).
  void on_broken(std::function<void(int64_t epoch)> callback);

 private:
  // One heartbeat, and what the store says of this member's epoch since the last.
  void beat();

  FtOptions options_;
  ReplicaSlot slot_;
  std::string id_;
  std::shared_ptr<Store> store_;      // the caller's thread
  std::shared_ptr<Store> heartbeat_;  // the heartbeat thread's connection

  mutable std::mutex mutex_;
  Membership epoch_;                      // guarded by mutex_
  std::function<void(int64_t)> on_broken_;  // guarded by mutex_
  std::atomic<int64_t> epoch_number_{0};
  std::atomic<int64_t> last_beat_ns_;  // steady clock
  std::atomic<int64_t> broken_epoch_{-1};
  std::atomic<int64_t> grow_epoch_{-1};
  std::atomic<bool> evicted_{false};

  datapar::detail::PeriodicThread heartbeat_thread_;  // last: stopped before the state it writes goes
};

}  // namespace datapar::ft
