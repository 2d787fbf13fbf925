// Membership. See datapar/ft/membership/membership.h.
#include "datapar/ft/membership/membership.h"

#include <algorithm>
#include <sstream>

namespace datapar::ft {

using detail::str_cat;

int Membership::rank_of(const std::string& id) const {
  for (int r = 0; r < size(); ++r) {
    if (members[r].id == id) return r;
  }
  return -1;
}

// One line per member, "<id> <step>" (and " <group> <index>" in replica groups), in rank
// order; or one line "stop <reason>".
std::string Membership::encode() const {
  if (!stop_reason.empty()) return (complete ? "done " : "stop ") + stop_reason;
  std::string out;
  for (const MembershipEntry& m : members) {
    out += str_cat(m.id, ' ', m.committed_step);
    if (m.slot.group >= 0) out += str_cat(' ', m.slot.group, ' ', m.slot.index);
    out += '\n';
  }
  return out;
}

Membership Membership::decode(int64_t number, const std::string& record) {
  Membership e;
  e.number = number;
  if (record.rfind("stop ", 0) == 0 || record.rfind("done ", 0) == 0) {
    e.stop_reason = record.substr(5);
    e.complete = record[0] == 'd';
    return e;
  }
  std::istringstream lines(record);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    MembershipEntry m;
    const bool read = static_cast<bool>(fields >> m.id >> m.committed_step);
    if (read && !(fields >> m.slot.group >> m.slot.index)) m.slot = ReplicaSlot{};  // no groups
    if (!read || m.committed_step < 0 || m.slot.group < -1 || m.slot.index < 0) {
      throw MembershipError(str_cat("membership epoch ", number, " has a malformed record line \"", line,
                                    "\": the store holds something the decider did not write"));
    }
    e.members.push_back(m);
  }
  if (e.members.empty()) throw MembershipError(str_cat("membership epoch ", number, " has no members"));
  return e;
}

void Membership::throw_verdict() const {
  if (complete) throw TrainingComplete("ft: the training is complete: " + stop_reason);
  throw MembershipError("ft: the job stops: " + stop_reason);
}

}  // namespace datapar::ft
