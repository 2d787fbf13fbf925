// The shared-memory layer, which the factories of the CPU backends (gloo, mpi) put over
// their transport: a process group whose members share machines. When all run on one
// machine its collectives go through shared memory (shm_collectives.h), and only what has
// no shared-memory algorithm (reduce, gather, scatter, all_to_all_single, send and recv)
// through the transport group it wraps (Gloo's TCP, MPI). When they run on several
// machines, several on some, all_reduce takes two levels (Note [Two-level all-reduce] in
// shared_memory_group.cc) and everything else the transport.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"
#include "collectives/exchange.h"

namespace datapar::detail {

// How the members of a group reach each other while their shared memory is set up.
struct SharedMemoryMeeting {
  // An exchange among every member of the group.
  std::unique_ptr<shm::Exchange> everyone;
  // For a group that spans machines, several members on some: an exchange among the members
  // of machine `machine`, this one being `local_rank` of `local_size` there (called on those
  // members only), and the transport group `name` of one member per machine, this one being
  // `rank` of `size` (on those members only). Null: such a group takes the transport alone.
  std::function<std::unique_ptr<shm::Exchange>(int machine, int local_rank, int local_size)> neighbours;
  std::function<std::shared_ptr<ProcessGroup>(const std::string& name, int rank, int size)> leaders;
};

// Makes a transport group of `size` members over `store`, this one being `rank`.
using MakeTransport = std::function<std::shared_ptr<ProcessGroup>(std::shared_ptr<Store> store, int rank, int size)>;

// The meeting of members that share `store` (a namespace of the job's store for this group
// alone), each exchange in a namespace of its own. `make_leaders` null: no two levels.
SharedMemoryMeeting meeting_through(std::shared_ptr<Store> store, int rank, int size,
                                    MakeTransport make_leaders = nullptr);

// Collective (every member calls it): `transport` wrapped as above when every member wants
// it (`wanted`) and some share a machine, else `transport` itself. The shared-memory
// operations fail after `timeout`; every collective after one that failed fails with
// CommError (the members' collectives no longer pair up). Throws TimeoutError when the
// members do not all answer within `timeout`.
std::shared_ptr<ProcessGroup> with_shared_memory(std::shared_ptr<ProcessGroup> transport,
                                                 SharedMemoryMeeting meeting, bool wanted,
                                                 std::chrono::milliseconds timeout);

}  // namespace datapar::detail
