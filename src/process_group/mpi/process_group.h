// What the MPI backend's factory (factory.cc) needs from its engine: the job's shape as MPI
// sees it, and the transport group it assembles. Compiled only with MPI.
#pragma once

#include <memory>
#include <vector>

#include "collectives/exchange.h"
#include "datapar/process_group/mpi.h"

namespace datapar::detail {

struct MpiWorld {
  int rank = 0;  // this process in MPI_COMM_WORLD
  int size = 1;
};

// Initialises MPI if needed (see new_mpi_process_group) and returns this process's place
// in MPI_COMM_WORLD. Under mpirun that is the job; without a launcher, a world of one.
MpiWorld mpi_world();

// The group new_mpi_process_group assembles: over a duplicate of MPI_COMM_WORLD, or of a
// communicator of the members `ranks`, with the exchange its members set up shared memory
// through; `group` null on a process outside `ranks`. What new_mpi_process_group throws.
struct MpiTransport {
  std::shared_ptr<ProcessGroup> group;
  std::unique_ptr<shm::Exchange> exchange;
};
MpiTransport new_mpi_transport(const std::vector<int>& ranks, const MpiOptions& options);

}  // namespace datapar::detail
