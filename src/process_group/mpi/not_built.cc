// The MPI backend in builds without MPI (CMake found none, or DATAPAR_WITH_MPI=OFF): a
// clear error from its factory and from new_mpi_process_group instead of an undefined
// symbol.
#include "datapar/error.h"
#include "datapar/process_group/mpi.h"
#include "process_group/backends.h"

namespace datapar {
namespace {

constexpr const char* kMpiNotBuilt =
    "the mpi backend is not available in this build of datapar (CMake found no MPI library). Install one (Debian: "
    "apt-get install libopenmpi-dev openmpi-bin), then configure and build datapar again, or use \"gloo\" for CPU "
    "tensors.";

}  // namespace

std::shared_ptr<ProcessGroup> new_mpi_process_group(const std::vector<int>&, MpiOptions) {
  throw InvalidArgumentError(std::string("new_mpi_process_group: ") + kMpiNotBuilt);
}

namespace detail {

Backend mpi_backend() { return Backend{"mpi", kMpiNotBuilt, nullptr, nullptr}; }

}  // namespace detail
}  // namespace datapar
