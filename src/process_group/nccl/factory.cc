// The NCCL backend's factory: new_nccl_process_group, NCCL's communicator assembled
// (assembly.h) with the stall inspector; and the backend init_process_group makes its groups
// with. In builds where Torch has CUDA and NCCL was found (not_built.cc elsewhere).
#include "datapar/error.h"
#include "datapar/process_group/nccl.h"
#include "datapar/rendezvous/prefix_store.h"
#include "process_group/assembly.h"
#include "process_group/backends.h"
#include "process_group/nccl/transport.h"

namespace datapar {

std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     NcclOptions options) {
  DATAPAR_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroup(nccl): rank ", rank, " is outside [0, ", size,
                ").");
  DATAPAR_CHECK(store != nullptr, "ProcessGroup(nccl): the store is null.");
  // Each group made on a store gets a namespace of its own, "nccl/<k>" for the k-th group
  // this rank made there: every rank makes a store's groups in the same order (as PyTorch
  // requires), so the ranks of one group agree on k, and a second group never reads the
  // first one's NCCL id, check-ins or stall reports.
  const int64_t k = store->add(detail::str_cat("nccl/groups-made-by-rank-", rank), 1);
  auto own = std::make_shared<PrefixStore>(detail::str_cat("nccl/", k), std::move(store));
  detail::Assembly assembly;
  assembly.stall_store = std::make_shared<PrefixStore>("stall", own);
  assembly.stall_warning = options.stall_warning;
  return detail::assemble(detail::new_nccl_transport(own, rank, size, options), std::move(assembly));
}

namespace detail {

Backend nccl_backend() {
  Backend b;
  b.name = "nccl";
  b.make = [](std::shared_ptr<Store> store, int rank, const std::vector<int>& ranks, const JobSettings& job) {
    NcclOptions options;
    options.timeout = job.timeout;
    options.local_rank = job.config.local_rank;
    options.end_process_on_failure = job.config.nccl_end_process_on_failure;
    return new_nccl_process_group(std::move(store), rank, static_cast<int>(ranks.size()), options);
  };
  return b;
}

}  // namespace detail
}  // namespace datapar
