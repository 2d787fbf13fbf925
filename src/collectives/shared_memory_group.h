// A process group whose members share machines. When all run on one machine its
// collectives go through shared memory (shm_collectives.h), and only what has no
// shared-memory algorithm (reduce, gather, scatter, all_to_all_single, send and recv) through the
// transport group it wraps, e.g. Gloo's TCP. When they run on several machines, several on
// some, all_reduce takes two levels (Note [Two-level all-reduce] in shared_memory_group.cc)
// and everything else the transport.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"

namespace datapar::detail {

// Makes the group of one member per machine (a transport group: no shared memory).
using MakeLeaders = std::function<std::shared_ptr<ProcessGroup>(std::shared_ptr<Store> store, int rank, int size)>;

// Collective over `store` (a namespace of the job's store for this group alone; every
// member calls it): `transport` wrapped as above when every member wants it (`wanted`) and
// some share a machine, else `transport` itself. `make_leaders` null: no two levels. Throws
// TimeoutError when the members do not all answer within `timeout`.
std::shared_ptr<ProcessGroup> with_shared_memory(std::shared_ptr<ProcessGroup> transport, std::shared_ptr<Store> store,
                                                 bool wanted, std::chrono::milliseconds timeout,
                                                 const MakeLeaders& make_leaders = nullptr);

}  // namespace datapar::detail
