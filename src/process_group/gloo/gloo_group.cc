// new_gloo_process_group: Gloo's TCP transport, with shared memory for the collectives of
// members that share a machine, and all-reduces in two levels for a group that spans
// machines (shm/shared_memory_group.h); CUDA tensors staged through pinned host memory
// (cuda_staging.h).
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/prefix_store.h"
#include "process_group/cuda_staging.h"
#include "process_group/gloo/backend.h"
#include "process_group/shm/shared_memory_group.h"

namespace datapar {

std::shared_ptr<ProcessGroup> new_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     GlooOptions options) {
  GlooOptions leaders_options = options;
  leaders_options.shared_memory = false;
  std::shared_ptr<ProcessGroup> tcp = detail::new_gloo_tcp_group(store, rank, size, options);
  const detail::MakeLeaders make_leaders = [&](std::shared_ptr<Store> leaders_store, int leader, int leaders) {
    return detail::new_gloo_tcp_group(std::move(leaders_store), leader, leaders, leaders_options);
  };
  std::shared_ptr<ProcessGroup> group = detail::with_cuda_staging(detail::with_shared_memory(
      std::move(tcp), std::make_shared<PrefixStore>("shm", store), options.shared_memory, options.timeout, make_leaders));
  if (size > 1) group->inspect_stalls(std::make_shared<PrefixStore>("stall", std::move(store)), options.stall_warning);
  return group;
}

}  // namespace datapar
