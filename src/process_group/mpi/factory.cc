// The MPI backend's factory: new_mpi_process_group, MPI's transport assembled (assembly.h)
// with shared memory for the collectives of members on one machine and the stall inspector
// where a store is given; and the backend init_process_group makes its groups with. In
// builds with MPI (not_built.cc elsewhere).
#include "datapar/process_group/mpi.h"
#include "datapar/rendezvous/prefix_store.h"
#include "process_group/assembly.h"
#include "process_group/backends.h"
#include "process_group/mpi/process_group.h"

namespace datapar {

std::shared_ptr<ProcessGroup> new_mpi_process_group(const std::vector<int>& ranks, MpiOptions options) {
  detail::MpiTransport transport = detail::new_mpi_transport(ranks, options);
  if (!transport.group) return nullptr;  // not a member
  detail::Assembly assembly;
  // Within one machine only: across machines MPI's own hierarchical collectives take the
  // place of the layer's two levels (and leaders would need a split of every member).
  assembly.meeting.everyone = std::move(transport.exchange);
  assembly.shared_memory = options.shared_memory;
  assembly.timeout = options.timeout;
  assembly.stall_store = std::move(options.stall_store);
  assembly.stall_warning = options.stall_warning;
  return detail::assemble(std::move(transport.group), std::move(assembly));
}

namespace detail {

Backend mpi_backend() {
  Backend b;
  b.name = "mpi";
  b.job_shape = [] {
    const MpiWorld world = mpi_world();
    return JobShape{world.rank, world.size};
  };
  b.make = [](std::shared_ptr<Store> store, int, const std::vector<int>& ranks, const JobSettings& job) {
    MpiOptions options;
    options.timeout = job.timeout;
    options.shared_memory = job.config.mpi_shared_memory;
    // The default group comes before the job's store (mpi: rank 0 serves it through the
    // group), and distributed.cc adds its inspector then; new_group's have their store.
    if (store) options.stall_store = std::make_shared<PrefixStore>("stall", std::move(store));
    return new_mpi_process_group(ranks, options);
  };
  return b;
}

}  // namespace detail
}  // namespace datapar
