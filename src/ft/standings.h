// The standings of the members of a new membership epoch (ft::Standing: steps, the epoch of
// the last commit, a vote whose outcome was missed), exchanged over the epoch's group with
// the caller's columns of what each member keeps (which parameters' state, which shards), and
// what follows from them alike on every member: each one's step once it applied a missed
// vote, the newest step, the first member at it.
//
// Note [A voted step whose outcome a member missed]
// The vote is an all-reduce: if any member finished it with "commit", every member of the
// epoch had contributed "may commit", i.e. had finished the step's gradient collectives. A
// member whose own vote then failed (a peer died as the result travelled) does not know
// whether the step was committed. Its standing says so (voted_step, voted_epoch); when the
// next epoch's exchange shows a member that committed that step in that epoch, it applies
// the update it voted for, from the gradients still in place, and is at the newest step
// with its shards like the others. Without it, a shard kept by this member and by the one
// that died would be lost at the newest step. A member whose vote was in an older epoch
// (it was stopped, and the others went on) applies nothing: its state is stale.
#pragma once

#include <cstdint>
#include <vector>

#include "datapar/ft/standing.h"
#include "datapar/process_group/process_group.h"

namespace datapar::ft::detail {

class Standings {
 public:
  // Collective over the epoch's group: every member's `mine` and `kept` (what it keeps, in
  // the caller's columns: as many on every member). Throws CommError or TimeoutError when a
  // member fails.
  Standings(ProcessGroup& group, const Standing& mine, const std::vector<int64_t>& kept);

  int size() const { return size_; }
  // Column `column` of what member `rank` keeps.
  int64_t kept(int rank, size_t column) const;
  // Member `rank`'s step once it applied a vote it missed (Note above): its standing's step,
  // or one more.
  int64_t step(int rank) const { return steps_.at(static_cast<size_t>(rank)); }
  bool applies_missed_vote(int rank) const;
  // The newest step, and the first member at it.
  int64_t newest() const { return newest_; }
  int first_at_newest() const;

 private:
  int64_t at(int rank, size_t column) const;

  int size_ = 0;
  size_t columns_ = 0;
  std::vector<int64_t> table_;
  std::vector<int64_t> steps_;
  int64_t newest_ = 0;
};

}  // namespace datapar::ft::detail
