// The NCCL engine's part of a group, which the backend's factory (factory.cc) assembles:
// a communicator on the GPU NcclOptions chooses (Note [Which GPU]), its members meeting
// through `store`, a namespace of this group's own. Compiled only with NCCL.
#pragma once

#include <memory>

#include "datapar/process_group/nccl.h"

namespace datapar::detail {

// What new_nccl_process_group throws, but for the checks of its arguments.
std::shared_ptr<ProcessGroup> new_nccl_transport(const std::shared_ptr<Store>& store, int rank, int size,
                                                 const NcclOptions& options);

}  // namespace datapar::detail
