// The flight recorder: every process group keeps its last N collectives (the operation, its
// tensors' dtypes and sizes, a sequence number per group, who issued it where the caller
// labels it ("bucket 3": DDP's buckets, ZeRO's shards), when it was issued, began to run
// (backends that run collectives on a thread of their own: gloo, shared memory, MPI) and
// ended, and how), so that when a job hangs or a collective fails, each rank can say where it
// was. As PyTorch's TORCH_NCCL_TRACE_BUFFER_SIZE, for every backend.
//
//   DATAPAR_FLIGHT_RECORDER=2000 datapar launch ... -- prog   # N per group; 0 or unset: off
//   DATAPAR_FLIGHT_RECORDER_DIR=fr                             # where dumps go (default: .)
//
// Each process dumps its groups' records to <dir>/flight-recorder-rank-<R>.json when a
// collective of it fails or times out (once), on SIGUSR1, and when dump_flight_recorder() is
// called. `datapar analyze DIR` reads every rank's dump (analyze_flight_records) and says
// which collective each rank is at, which ranks differ, and how.
//
// DATAPAR_DISTRIBUTED_DEBUG=DETAIL (as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL) checks every
// collective's operation, dtypes and sizes across the group before running it (one small
// all_gather more per collective) and fails at once with both ranks' calls named, where a
// mismatched collective would otherwise hang or read another collective's bytes.
#pragma once

#include <cstddef>
#include <string>

namespace datapar {

// Records the last `entries` collectives of every process group made from now on (0: off)
// and installs the SIGUSR1 dump; `dir`: where dumps go. Read from the environment by the
// first group made, so programs rarely call it.
void enable_flight_recorder(size_t entries, const std::string& dir = ".");
// Whether groups made now record, and how many entries.
size_t flight_recorder_entries();

// Writes every live group's records of this process to <dir>/flight-recorder-rank-<R>.json
// (R: the default group's rank, or the first recording group's) and returns the path; ""
// when nothing records. `reason` goes into the file.
std::string dump_flight_recorder(const std::string& reason = "on demand");

// What the dumps in `dir` say, in one paragraph: for each group, the first collective at
// which the ranks part (a rank that has not issued it, one that issued another operation,
// dtype or size), which ranks are where, or that all are in the same collective. Throws
// InvalidArgumentError when `dir` holds no dump.
std::string analyze_flight_records(const std::string& dir);

// Whether every collective is checked across ranks: DATAPAR_DISTRIBUTED_DEBUG=DETAIL, or
// check_collectives(true).
bool collectives_checked();
// Turns the check on or off for the collectives issued from now on (every rank alike).
void check_collectives(bool on);

}  // namespace datapar
