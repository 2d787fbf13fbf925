// The Gloo backend: CPU tensors over TCP, through shared memory among the members on one
// machine; CUDA tensors too where Torch has CUDA. Built in every build of datapar.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/store.h"
#include "datapar/timeout.h"

namespace datapar {

struct GlooOptions {
  // The address other processes reach this one on (its TCP transport binds it).
  // Empty: this machine's hostname.
  std::string hostname;
  // Limit for connecting and for every collective.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // When every member runs on this machine, all_reduce, reduce_scatter, all_gather,
  // broadcast and barrier go through one shared-memory region instead of TCP (several times
  // faster; Note [Shared-memory collectives] in src/collectives/shm_collectives.cc).
  // When the members span machines, several on some, all_reduce takes two levels: shared
  // memory within each machine, TCP between one leader per machine (Note [Two-level
  // all-reduce] in src/process_group/shared_memory_group.cc).
  // false on any member: TCP for everything. init_process_group: $DATAPAR_SHM=0 turns it off.
  bool shared_memory = true;
  // A collective not completed after this long is reported, with the ranks that have not
  // issued it (ProcessGroup::inspect_stalls); zero: never.
  std::chrono::milliseconds stall_warning = kDefaultStallWarning;
};

// A Gloo process group of `size` processes, this one being `rank`, meeting through `store`
// (which every process must share, e.g. from rendezvous()). Blocks until all processes
// have connected. Throws InvalidArgumentError for a bad rank or size, TimeoutError or
// CommError when the others do not connect in time. Its collectives take CPU tensors, and
// CUDA tensors in builds where Torch has CUDA (takes_cuda_tensors()); send and recv take
// CPU tensors only.
std::shared_ptr<ProcessGroup> new_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     GlooOptions options = {});

struct JobConfig;  // datapar/rendezvous/job_config.h

// The options init_process_group("gloo", init_method) gives the group of a job described by
// `config` (DATAPAR_GLOO_HOSTNAME or the address its store implies, DATAPAR_SHM), for the
// groups a program makes itself on the job's store, e.g. one per membership epoch of a
// fault-tolerant job. The timeout is left at its default.
GlooOptions gloo_job_options(const JobConfig& config, const std::string& init_method = "env://");

}  // namespace datapar
