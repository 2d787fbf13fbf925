// Fault-tolerant membership (issue 31, docs/fault_tolerance.md): ft::Membership, the record
// of one membership epoch (who trains, in which rank order, from which steps), which the
// decider (decider.h) publishes in the store and every member (member.h) reads alike, so
// that no decision is taken by one rank alone. Numbered 1, 2, ...: a membership epoch,
// not a training epoch. This folder is torch-free: the launcher hosts the decider.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "datapar/ft/membership/options.h"

namespace datapar::ft {

// The job cannot go on as a fault-tolerant job: below the minimum of members, the decider
// gone, this member evicted. The message says which, and what to do.
class MembershipError : public Error {
 public:
  using Error::Error;
};

// The training already ended (a member finished it) when this member asked to join: a
// replacement that came too late. Nothing is left to do; not a failure.
class TrainingComplete : public MembershipError {
 public:
  using MembershipError::MembershipError;
};

// Where a member sits in a job whose members come in replica groups
// (FtOptions::replica_group_size): the group, and its place in it (its shard index under
// HSDP). A restarted process takes the slot of the one it replaces.
struct ReplicaSlot {
  int group = -1;  // -1: the job has no replica groups
  int index = 0;
};

// One member of a membership epoch, as the decider recorded it.
struct MembershipEntry {
  std::string id;              // the member's incarnation id: a restarted process is a new one
  int64_t committed_step = 0;  // the steps it had committed when it asked to join (the
                               // members exchange their own when they meet: ElasticGroup::take_newest_state)
  ReplicaSlot slot;
};

// Membership epoch `number`: its members in rank order, or the decider's verdict that the
// job stops.
struct Membership {
  int64_t number = 0;
  std::vector<MembershipEntry> members;
  std::string stop_reason;  // non-empty: no epoch can form; the job stops
  bool complete = false;    // with stop_reason: because the training is complete

  int size() const { return static_cast<int>(members.size()); }
  // The rank of member `id` in this epoch, or -1.
  int rank_of(const std::string& id) const;

  // The record in the store, and back (MembershipError for a malformed one).
  // For a verdict (stop_reason), throws what a member's join() throws: TrainingComplete or
  // MembershipError.
  [[noreturn]] void throw_verdict() const;
  std::string encode() const;
  static Membership decode(int64_t number, const std::string& record);
};

}  // namespace datapar::ft
