// nccl_probe's world1 scenario: NCCL's CUDA paths on one GPU (nccl_world_one.cc, compiled
// only where datapar has the nccl backend).
#pragma once

#include <string>

#include "datapar/process_group/process_group.h"

namespace datapar::testing {

// Runs every check on `group` (the default group, nccl, one rank) and on groups of its own
// made in `dir`; prints "ok" or "FAILED" per check. Returns 0 when all hold.
int world_one(ProcessGroup& group, const std::string& dir);

}  // namespace datapar::testing
