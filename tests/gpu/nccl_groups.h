// nccl_probe's scenarios that make NCCL groups of their own (nccl_groups.cc, compiled only
// where datapar has the nccl backend): world1, NCCL's CUDA paths on one GPU; two_groups.
#pragma once

#include <string>

#include "datapar/process_group/process_group.h"

namespace datapar::testing {

// Runs every check on `group` (the default group, nccl, one rank) and on groups of its own
// made in `dir`; prints "ok" or "FAILED" per check. Returns 0 when all hold.
int world_one(ProcessGroup& group, const std::string& dir);

// Every rank makes two nccl groups, one after the other, on one store in `dir`, and
// all-reduces on each: the second must not read the first one's NCCL id or check-ins.
// Returns 0 when both give the closed-form sum.
int two_groups(int rank, int world, const std::string& dir);

}  // namespace datapar::testing
