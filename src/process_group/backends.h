// The backend factory: the backends datapar knows, and how init_process_group() and
// new_group() make a group on each. One list (backends.cc) of one factory per backend
// folder: its factory.cc where the backend was built, its not_built.cc, which says how to
// get it, elsewhere. No #if outside CMake chooses between them (STYLE.md).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/rendezvous/store.h"

namespace datapar::detail {

// What every group of a job is made with: init_process_group's arguments and the job's
// configuration, from which each backend's factory takes its own options.
struct JobSettings {
  JobConfig config;
  std::string init_method;
  std::chrono::milliseconds timeout{};
};

// This process's place in a job whose launcher already told the backend (mpi).
struct JobShape {
  int rank = -1;
  int world_size = -1;
};

struct Backend {
  std::string name;
  // Why this build has no such backend, and how to get it; empty: built in.
  std::string not_built;
  // Set for a backend whose processes already know each other (mpi: mpirun connected
  // them): the job's shape, from the backend. Unset: the processes meet through a store
  // (rendezvous() on the init method), which also gives rank and world size.
  std::function<JobShape()> job_shape;
  // A group of `ranks.size()` processes, this one being `rank` in it. `ranks`: the job's
  // ranks of the members, in group order (every rank for the default group). `store`:
  // the group's own namespace in the job's store (null without one).
  std::function<std::shared_ptr<ProcessGroup>(std::shared_ptr<Store> store, int rank, const std::vector<int>& ranks,
                                              const JobSettings& job)>
      make;
};

// Each defined by its backend folder's factory.cc, or its not_built.cc.
Backend gloo_backend();
Backend mpi_backend();
Backend nccl_backend();

// The backend called `name`. Throws InvalidArgumentError (prefixed "init_process_group: ")
// for a backend this build lacks, saying why, or for an unknown name, listing this build's.
const Backend& find_backend(const std::string& name);

}  // namespace datapar::detail
