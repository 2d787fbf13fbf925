// A process group whose members all run on one machine: its collectives go through shared
// memory (shm_collectives.h) and only what has no shared-memory algorithm (reduce, gather,
// scatter, all_to_all, send and recv) through the transport group it wraps, e.g. Gloo's TCP.
#pragma once

#include <chrono>
#include <memory>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"

namespace datapar::detail {

// Collective over `store` (a namespace of the job's store for this group alone; every
// member calls it): `transport` wrapped as above when every member runs on this machine and
// wants it (`wanted`), else `transport` itself. Throws TimeoutError when the members do not
// all answer within `timeout`.
std::shared_ptr<ProcessGroup> with_shared_memory(std::shared_ptr<ProcessGroup> transport, std::shared_ptr<Store> store,
                                                 bool wanted, std::chrono::milliseconds timeout);

}  // namespace datapar::detail
