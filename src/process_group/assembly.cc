// See assembly.h.
#include "process_group/assembly.h"

#include <utility>

#include "process_group/cuda_staging.h"

namespace datapar::detail {

std::shared_ptr<ProcessGroup> assemble(std::shared_ptr<ProcessGroup> transport, Assembly assembly) {
  std::shared_ptr<ProcessGroup> group = std::move(transport);
  if (assembly.meeting.everyone) {
    group = with_shared_memory(std::move(group), std::move(assembly.meeting), assembly.shared_memory,
                               assembly.timeout);
  }
  if (assembly.stage_cuda) group = with_cuda_staging(std::move(group));
  if (assembly.stall_store && group->size() > 1) {
    group->inspect_stalls(std::move(assembly.stall_store), assembly.stall_warning);
  }
  return group;
}

}  // namespace datapar::detail
