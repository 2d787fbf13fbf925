// What the backend factory (backends.cc) needs from the MPI backend beyond the public
// new_mpi_process_group(): the job's shape as MPI sees it. Compiled only with MPI.
#pragma once

namespace datapar::detail {

struct MpiWorld {
  int rank = 0;  // this process in MPI_COMM_WORLD
  int size = 1;
};

// Initialises MPI if needed (see new_mpi_process_group) and returns this process's place
// in MPI_COMM_WORLD. Under mpirun that is the job; without a launcher, a world of one.
MpiWorld mpi_world();

}  // namespace datapar::detail
