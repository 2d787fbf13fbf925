// The MPI backend: the processes of an mpirun (or srun) job, CPU tensors. In builds where
// CMake found an MPI library (DATAPAR_HAVE_MPI in datapar/config.h); elsewhere its factory
// throws InvalidArgumentError saying how to get it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"
#include "datapar/timeout.h"

namespace datapar {

struct MpiOptions {
  // Limit for joining the group and for every operation. An operation still running then
  // fails with TimeoutError; a collective that timed out leaves the group unusable (later
  // collectives fail with CommError), a send or recv does not.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // When every member runs on one machine: all_reduce, reduce_scatter, all_gather,
  // broadcast and barrier through shared memory, as for Gloo (GlooOptions::shared_memory);
  // false: MPI's own. A member that says false makes the whole group do without.
  // init_process_group passes JobConfig::mpi_shared_memory (DATAPAR_MPI_SHM=0: false).
  bool shared_memory = true;
  // A namespace of this group's own in a store every member shares (e.g.
  // PrefixStore("group-a", job_store)): through it the group names the ranks that have not
  // issued a collective that stalls past `stall_warning` (ProcessGroup::inspect_stalls;
  // MPI itself cannot say who is missing). Null: no such warning. init_process_group and
  // new_group give one.
  std::shared_ptr<Store> stall_store;
  std::chrono::milliseconds stall_warning = kDefaultStallWarning;
};

// An MPI process group: the processes of an mpirun (or srun) job, as MPI numbers them.
// `ranks`: the MPI_COMM_WORLD ranks of the members, in the order that gives their ranks in
// the group; empty: the whole world. Returns nullptr on a process outside `ranks`.
//
// Initialises MPI on first use (MPI_Init_thread with MPI_THREAD_MULTIPLE) and finalises it
// at exit if datapar initialised it; a program that initialised MPI itself must have asked
// for MPI_THREAD_MULTIPLE and finalises it itself, after releasing the groups.
// Every member must call it, in the same order as its other group constructions. Blocks
// until all have: for the whole world at most options.timeout (TimeoutError), for a subset
// without limit (MPI has no non-blocking MPI_Comm_create_group).
// Data moves as MPI's own types (float32/64, int32/64); float16 and bfloat16 are widened to
// float32 for reductions.
// Throws InvalidArgumentError when this build has no MPI backend or for bad ranks,
// CommError when MPI cannot be initialised or lacks MPI_THREAD_MULTIPLE.
std::shared_ptr<ProcessGroup> new_mpi_process_group(const std::vector<int>& ranks = {}, MpiOptions options = {});

}  // namespace datapar
