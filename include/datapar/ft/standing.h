// ft::Standing: where a member stands when it joins a membership epoch, what the members
// exchange to agree on the newest state (src/ft/standings.h) before they re-shard it.
#pragma once

#include <cstdint>

namespace datapar::ft {

struct Standing {
  int64_t step = 0;          // steps committed
  int64_t commit_epoch = 0;  // the membership epoch that committed the last of them (0: none)
  // A step this member voted to commit without learning the outcome (its vote failed), and
  // the epoch of that vote; -1: none. If another member of that epoch committed it, this
  // member applies the update too: the gradients it voted with are still in place.
  int64_t voted_step = -1;
  int64_t voted_epoch = 0;
};

}  // namespace datapar::ft
