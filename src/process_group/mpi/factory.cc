// The MPI backend's factory: the backend init_process_group makes its groups with, in
// builds with MPI (not_built.cc elsewhere).
#include "datapar/process_group/mpi.h"
#include "process_group/backends.h"
#include "process_group/mpi/process_group.h"

namespace datapar::detail {

Backend mpi_backend() {
  Backend b;
  b.name = "mpi";
  b.job_shape = [] {
    const MpiWorld world = mpi_world();
    return JobShape{world.rank, world.size};
  };
  b.make = [](std::shared_ptr<Store>, int, const std::vector<int>& ranks, const JobSettings& job) {
    MpiOptions options;
    options.timeout = job.timeout;
    options.shared_memory = job.config.mpi_shared_memory;
    return new_mpi_process_group(ranks, options);
  };
  return b;
}

}  // namespace datapar::detail
