// The one step that turns a backend's transport group into the group a user gets (issue 45),
// called by every backend's factory.cc: the shared-memory layer over the transport where
// the members want it (shared_memory_group.h), CUDA tensors staged through pinned host
// memory for a host transport (cuda_staging.h), and the stall inspector where the members
// share a store (ProcessGroup::inspect_stalls).
#pragma once

#include <chrono>
#include <memory>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"
#include "process_group/shared_memory_group.h"

namespace datapar::detail {

struct Assembly {
  // How the members meet to set up shared memory; `meeting.everyone` null: no layer.
  SharedMemoryMeeting meeting;
  bool shared_memory = false;  // this member wants it (any member that does not: none)
  std::chrono::milliseconds timeout = kDefaultTimeout;  // the shared-memory operations'
  // A host transport (gloo, mpi's shared memory): CUDA tensors staged through pinned memory.
  bool stage_cuda = false;
  // A namespace of this group's own in a store its members share; null: no inspector.
  std::shared_ptr<Store> stall_store;
  std::chrono::milliseconds stall_warning = kDefaultStallWarning;
};

// Collective (every member calls it, with the same kind of assembly): `transport` with what
// `assembly` asks for, in that order.
std::shared_ptr<ProcessGroup> assemble(std::shared_ptr<ProcessGroup> transport, Assembly assembly);

}  // namespace datapar::detail
