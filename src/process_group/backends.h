// The backend factory: which backends this build of datapar has, and how
// init_process_group() and new_group() make a group on each. The one place that knows
// what was compiled in (STYLE.md: a backend is chosen by one factory, not by #if ladders
// in core files).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"

namespace datapar::detail {

// What init_process_group was given, and resolved from the job's configuration (JobConfig),
// for every group of the job.
struct BackendSettings {
  std::chrono::milliseconds timeout{};
  std::string gloo_hostname;      // the address other processes reach this one on (gloo)
  bool shared_memory = true;      // gloo: collectives through shared memory within a machine
  bool mpi_shared_memory = true;  // mpi: the same
  std::optional<std::string> local_rank;  // nccl: LOCAL_RANK, which picks the GPU
  std::chrono::milliseconds stall_warning = kDefaultStallWarning;
  bool nccl_end_process_on_failure = true;  // NcclOptions::end_process_on_failure
};

// This process's place in a job whose launcher already told the backend (mpi).
struct JobShape {
  int rank = -1;
  int world_size = -1;
};

struct Backend {
  std::string name;
  // Set for a backend whose processes already know each other (mpi: mpirun connected
  // them): the job's shape, from the backend. Unset: the processes meet through a store
  // (rendezvous() on the init method), which also gives rank and world size.
  std::function<JobShape()> job_shape;
  // A group of `ranks.size()` processes, this one being `rank` in it. `ranks`: the job's
  // ranks of the members, in group order (every rank for the default group). `store`:
  // the group's own namespace in the job's store (null without one).
  std::function<std::shared_ptr<ProcessGroup>(std::shared_ptr<Store> store, int rank, const std::vector<int>& ranks,
                                              const BackendSettings& settings)>
      make;
};

// The backend called `name`. Throws InvalidArgumentError (prefixed "init_process_group: ")
// for a backend this build lacks, saying why, or for an unknown name, listing this build's.
const Backend& find_backend(const std::string& name);

}  // namespace datapar::detail
