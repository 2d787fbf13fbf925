// The NCCL backend's factory: the backend init_process_group makes its groups with, in
// builds where Torch has CUDA and NCCL was found (not_built.cc elsewhere).
#include "datapar/process_group/nccl.h"
#include "process_group/backends.h"

namespace datapar::detail {

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

}  // namespace datapar::detail
