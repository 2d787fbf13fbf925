// new_gloo_process_group: Gloo's TCP transport, with shared memory for the collectives of
// members that share a machine (shm/shared_memory_group.h).
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/prefix_store.h"
#include "process_group/gloo/backend.h"
#include "process_group/shm/shared_memory_group.h"

namespace datapar {

std::shared_ptr<ProcessGroup> new_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     GlooOptions options) {
  const bool shared_memory = options.shared_memory;
  const std::chrono::milliseconds timeout = options.timeout;
  std::shared_ptr<ProcessGroup> tcp = detail::new_gloo_tcp_group(store, rank, size, std::move(options));
  return detail::with_shared_memory(std::move(tcp), std::make_shared<PrefixStore>("shm", std::move(store)),
                                    shared_memory, timeout);
}

}  // namespace datapar
