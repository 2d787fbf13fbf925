// Fault-tolerant membership (issue 31, docs/fault_tolerance.md): the record of one
// membership epoch, which the decider (decider.h) publishes in the store and every
// member (member.h) reads alike, so that no decision is taken by one rank alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "datapar/ft/options.h"

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

struct EpochMember {
  std::string id;              // the member's incarnation id: a restarted process is a new one
  int64_t committed_step = 0;  // the last step it committed
};

// Epoch `number`: its members in rank order, or the decider's verdict that the job stops.
struct Epoch {
  int64_t number = 0;
  std::vector<EpochMember> members;
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
  static Epoch decode(int64_t number, const std::string& record);
};

}  // namespace datapar::ft
