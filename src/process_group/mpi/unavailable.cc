// The MPI backend's public entry point in builds without MPI (CMake found none, or
// DATAPAR_WITH_MPI=OFF): a clear error instead of an undefined symbol.
#include "datapar/error.h"
#include "datapar/process_group/process_group.h"

namespace datapar {

std::shared_ptr<ProcessGroup> new_mpi_process_group(const std::vector<int>&, MpiOptions) {
  throw InvalidArgumentError(
      "new_mpi_process_group: this build of datapar has no MPI backend (CMake found no MPI library). Install one "
      "(Debian: apt-get install libopenmpi-dev openmpi-bin), then configure and build datapar again.");
}

}  // namespace datapar
