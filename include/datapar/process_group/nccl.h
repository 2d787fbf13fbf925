// The NCCL backend for CUDA tensors. Declared everywhere; defined only in builds where
// Torch has CUDA (datapar/config.h: DATAPAR_HAVE_CUDA), so call it only there.
#pragma once

#include <chrono>
#include <memory>

#include "datapar/process_group/process_group.h"

namespace datapar {

struct NcclOptions {
  // This rank's GPU; -1: rank % visible devices (one process per GPU on each node works
  // when ranks are numbered node by node, as datapar launch and torchrun do).
  int device = -1;
  // Limit for joining and for every operation; an operation past it aborts the group.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// A NCCL process group of `size` processes meeting through `store` (rank 0 publishes the
// NCCL id there). Operations take CUDA tensors on this rank's device; send/recv pairs that
// cross (both ranks send first) must be issued so the receives are posted in time, as
// NCCL requires. Throws InvalidArgumentError without a CUDA device, TimeoutError when the
// others do not join in time.
std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     NcclOptions options = {});

}  // namespace datapar
