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

// A group made by new_nccl_process_group warns on a stall (its factory assembles it with the
// stall inspector): rank 1 comes 2 s late to an all_reduce; rank 0 must be warned, naming it.
int stall_warning(int rank, int world, const std::string& dir);

// One rank, a group of its own in `dir` with a 1 s timeout: an all_reduce queued behind
// about 5 s of GPU work, wait() (which returns at once), then the watchdog's timeout.
// `end_process`: NcclOptions::end_process_on_failure. true: the process must end there,
// with the error on stderr (this returns 1 if it does not); false: the next synchronize()
// and call must throw (returns 0 when they do).
int failure_after_wait(const std::string& dir, bool end_process);

// DDP on `group` (nccl, 2 or more ranks) with a RankBalancer fed as `datapar train --balance
// auto` feeds it; rank 1 computes slower (a kernel of about 50 ms each step) and the others
// wait for it in backward. Returns 0 when every rank gives rank 1 the smallest share.
int balance_slowed_rank(ProcessGroup& group);

}  // namespace datapar::testing
