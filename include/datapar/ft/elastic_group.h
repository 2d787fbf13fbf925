// ElasticGroup: the process group of a fault-tolerant job (issue 31, docs/fault_tolerance.md),
// made anew for each membership epoch. It owns this rank's ft::Member; join() leaves the
// old epoch's group (aborting it) and makes the new epoch's on the store prefix
// "ft/<run>/<E>/", never reused, so a rank of an old epoch cannot meet a new one. When the
// decider breaks the epoch (a member evicted, or joining again after a failed step), the
// member's heartbeat thread aborts the epoch's group, so collectives blocked on the lost
// member fail at once instead of at the timeout.
//
// The per-step protocol (ft::FaultTolerantDdp runs it for DDP): train the step with
// group(); vote(step); apply the update only if the vote says commit; on a CommError or
// TimeoutError anywhere, or when the vote says so, join() again with the committed step,
// then take_newest_state() from a member at the newest step.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "datapar/ft/membership/membership.h"
#include "datapar/ft/membership/member.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"

namespace datapar::ft {

// Makes the group of an epoch: `size` members over `store` (a namespace of the job's store
// for that epoch alone), this one being `rank`; e.g. new_gloo_process_group.
using MakeGroup = std::function<std::shared_ptr<ProcessGroup>(std::shared_ptr<Store> store, int rank, int size)>;

// What every rank's vote at the end of a step decided, the same on every rank.
struct Vote {
  bool commit = false;       // every rank may commit this step (and is at the same step)
  bool reconfigure = false;  // join again after this step (a newcomer waits, or no commit)
};

class ElasticGroup {
 public:
  // `store`: the job's store (the members of one job and its decider share `run`). `slot`:
  // this member's place in its replica group (FtOptions::replica_group_size).
  ElasticGroup(std::shared_ptr<Store> store, std::string run, FtOptions options, MakeGroup make_group,
               ReplicaSlot slot = {});
  // Leaves: aborts the group; a collective its backend could not abandon is waited for
  // (at most the group's timeout) by a thread of its own, not by the destructor.
  ~ElasticGroup();
  ElasticGroup(const ElasticGroup&) = delete;
  ElasticGroup& operator=(const ElasticGroup&) = delete;

  // Aborts the current epoch's group (if any), joins the next epoch having committed
  // `committed_step`, and makes its group. Throws MembershipError when the job cannot go on
  // (ft::Member::join), CommError or TimeoutError when the group cannot be made (a member
  // failed meanwhile: join again).
  const Membership& join(int64_t committed_step);

  // After join(): members behind the newest step take the state of one member at it.
  // The members exchange the steps they committed (`committed_step`: this one's) over the
  // group: an epoch's record says what each had when it asked to join, and a forged record,
  // or steps committed since in a group that record formed, would make it wrong (issue 46).
  // The first rank at the newest step calls `save` and broadcasts its bytes; ranks behind
  // it call `load` with them; ranks at the newest step load nothing. Collective; throws
  // CommError or TimeoutError. Returns the newest step.
  int64_t take_newest_state(int64_t committed_step, const std::function<std::string()>& save,
                            const std::function<void(const std::string&)>& load);

  // The vote after a step's collectives, before its update: an all-reduce of whether this
  // rank may commit (ft::Member::may_commit), whether a newcomer waits, and `step`. Throws
  // CommError or TimeoutError when a member failed.
  Vote vote(int64_t step);

  // Collective over `ranks` of the current epoch (this one among them, every one calling it
  // with the same `name` and `ranks`): a group of those members alone, made as the epoch's
  // (make_group) and aborted and retired with it (HSDP's shard groups). Throws as join().
  std::shared_ptr<ProcessGroup> subgroup(const std::string& name, const std::vector<int>& ranks);

  // Abandons the current epoch's group (ProcessGroup::abort): after a failed step, so that
  // nothing waits on its collectives in flight. join() does it too.
  void abort();
  bool aborted() const { return group_ && group_->aborted(); }

  // Leaves the epoch: waits (at most the eviction timeout) until every member of it has
  // called it, so that none is still in a collective with this one when its connections
  // close. Call after the last step's vote at the end of the job; join() calls it when it
  // leaves a group that did not fail.
  void leave();

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  const Membership& epoch() const { return epoch_; }
  const FtOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int size() const { return epoch_.size(); }
  Member& member() { return *member_; }

 private:
  // The group of an epoch that ended: aborted, and destroyed on a thread of its own.
  void retire();
  // make_group_ over the epoch's store under `prefix` (within "ft/<run>/<E>/"), as rank
  // `rank` of `size`; a broken epoch's failure said as one.
  std::shared_ptr<ProcessGroup> make_epoch_group(const std::string& prefix, int rank, int size);

  std::shared_ptr<Store> store_;
  std::string run_;
  FtOptions options_;
  MakeGroup make_group_;
  std::unique_ptr<Member> member_;

  Membership epoch_;
  int rank_ = -1;
  int64_t left_epoch_ = 0;  // the epoch leave() was last called in
  std::shared_ptr<ProcessGroup> group_;

  // For the member's heartbeat thread, which aborts a broken epoch's group.
  std::mutex abort_mutex_;
  int64_t group_epoch_ = 0;                  // guarded by abort_mutex_
  std::shared_ptr<ProcessGroup> abortable_;  // guarded by abort_mutex_
  std::vector<std::shared_ptr<ProcessGroup>> subgroups_;  // the epoch's; guarded by abort_mutex_
  std::vector<std::thread> reapers_;         // destroy retired groups
};

}  // namespace datapar::ft
