// CUDA tensors on a host group (gloo, and its shared-memory collectives), staged through
// pinned host memory as PyTorch's ProcessGroupGloo does (Note [Staging CUDA tensors] in
// cuda_staging.cc): DDP of a model on a GPU over a CPU transport.
#pragma once

#include <memory>

#include "datapar/process_group/process_group.h"

namespace datapar::detail {

// `host_group`, taking CUDA tensors too (takes_cuda_tensors()) in builds where Torch has
// CUDA; `host_group` itself in the others, where no CUDA tensor can exist.
std::shared_ptr<ProcessGroup> with_cuda_staging(std::shared_ptr<ProcessGroup> host_group);

}  // namespace datapar::detail
