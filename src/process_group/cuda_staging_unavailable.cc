// with_cuda_staging where Torch has no CUDA: no CUDA tensor exists to stage.
#include "process_group/cuda_staging.h"

namespace datapar::detail {

std::shared_ptr<ProcessGroup> with_cuda_staging(std::shared_ptr<ProcessGroup> host_group) { return host_group; }

}  // namespace datapar::detail
