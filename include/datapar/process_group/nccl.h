// The NCCL backend for CUDA tensors. In builds where Torch has CUDA and NCCL was found
// (DATAPAR_HAVE_NCCL in datapar/config.h); elsewhere new_nccl_process_group throws
// InvalidArgumentError saying how to get it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "datapar/process_group/process_group.h"
#include "datapar/timeout.h"

namespace datapar {

struct NcclOptions {
  // This process's GPU. -1 (default): the same rule for every group of the process, never
  // its rank (a subgroup passes its rank within the subgroup, which says nothing about this
  // machine's GPUs):
  //   1. local_rank (below), as datapar launch and torchrun set LOCAL_RANK; it must be
  //      an integer in [0, visible devices), else InvalidArgumentError;
  //   2. else the caller's current CUDA device (c10::cuda::current_device()): under a
  //      launcher that sets no LOCAL_RANK (mpirun, srun), call c10::cuda::set_device() first.
  // >= 0: that device, whatever the environment says. A device that does not exist is an
  // InvalidArgumentError naming it and the number visible.
  int device = -1;
  // LOCAL_RANK as the launcher set it, for the rule above; nullopt: not set.
  // init_process_group passes JobConfig::local_rank; a direct caller passes
  // resolve_job_config().local_rank to follow the launcher (the group reads no environment).
  std::optional<std::string> local_rank;
  // Limit for joining (the store check-in and NCCL's communicator init together) and for
  // every operation, counted from its launch. An operation still running then, or one
  // NCCL reports an error for, aborts the group (see new_nccl_process_group).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // How Work::wait() waits; PyTorch's TORCH_NCCL_BLOCKING_WAIT.
  // false (default): wait() makes the caller's current CUDA stream wait for the operation
  //   and returns at once; work queued on that stream afterwards sees the results. It
  //   throws only for an operation already known to have failed; a failure or timeout found
  //   later aborts the group, and the next call on it throws CommError.
  // true: wait() blocks the calling thread until the operation has completed on the GPU,
  //   and throws its CommError or TimeoutError. Slower (the host idles while the GPU
  //   works), but every failure surfaces at the wait() of the operation that failed.
  // barrier()'s wait() always blocks the host, as in PyTorch.
  bool blocking_wait = false;
  // What a failure or timeout found after wait() returned does. wait() does not block, so
  // by then the caller's stream has run what it queued behind the operation (DDP's copies
  // into .grad, an optimizer step) on partial results, and the parameters are corrupt.
  // true (default): the watchdog aborts the communicator, writes the error (operation,
  //   rank, group) to stderr and ends the process with status 1, before anything saves
  //   a checkpoint; restart from the last one. PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING.
  // false: the program handles it: the next wait(), synchronize() or call on the group
  //   throws the error, and the program must discard the parameters that step touched
  //   (reload a checkpoint) itself.
  // Failures found before wait() returned never end the process: wait() throws them.
  bool end_process_on_failure = true;
  // A collective not completed after this long is reported, with the ranks that have not
  // issued it (ProcessGroup::inspect_stalls); zero: never.
  std::chrono::milliseconds stall_warning = kDefaultStallWarning;
};

// A NCCL process group of `size` processes meeting through `store` (rank 0 publishes the
// NCCL id there). Blocks until every rank has joined, at most options.timeout.
//
// Operations take dense CUDA tensors on this process's device (device(), see
// NcclOptions::device) and return at once. Each runs on the group's own CUDA stream after
// the work already queued on the caller's current stream (which must have produced the
// inputs), so it overlaps with what the caller queues next; see NcclOptions::blocking_wait
// for what wait() does. The caller's current device and stream are never changed.
// Tensors may be freed as soon as the call returns: the caching allocator keeps their
// memory until the group's stream is done with it; but do not write them before wait().
// Operations may be issued from several threads, but the order is NCCL's: every rank must
// issue the same operations in the same order. send and recv are queued behind earlier
// operations like collectives, so send/recv pairs that cross (both ranks send first) must
// be issued so that the receives are posted in time, as NCCL requires: else both wait
// until the timeout, whose TimeoutError says so. NCCL has no message tags: a tag other than
// 0 is an InvalidArgumentError (PyTorch ignores it).
// Dtypes: operations that only move data (broadcast, the gathers and scatters, send, recv)
// take every dtype (bool, int16, complex: as bytes where NCCL has no such type); reductions
// take float32/64, float16, bfloat16, int8/32/64 and uint8 (else InvalidArgumentError).
//
// Failures: a watchdog thread watches every operation. When NCCL reports an error or an
// operation runs past options.timeout, it aborts the communicator, fails that operation
// (CommError, or TimeoutError) and every later one, and every later call on the group
// throws CommError: make a new group. Where a wait() had already returned for a failed
// operation, the process ends instead (NcclOptions::end_process_on_failure). Destroying the group waits for what is in flight,
// then finalizes the communicator together with the other ranks (at most the timeout
// each; then it is aborted): destroy groups in the same order on every rank.
//
// Throws InvalidArgumentError for bad arguments, without a usable CUDA device or in a build
// without NCCL,
// TimeoutError when the others do not join in time, CommError when NCCL cannot connect.
std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     NcclOptions options = {});

}  // namespace datapar
