// The NCCL backend in builds without it (Torch without CUDA, or no NCCL found): a clear
// error from its factory and from new_nccl_process_group instead of an undefined symbol.
#include "datapar/error.h"
#include "datapar/process_group/nccl.h"
#include "process_group/backends.h"

namespace datapar {
namespace {

constexpr const char* kNcclNotBuilt =
    "the nccl backend is not available in this build of datapar (it needs libtorch with CUDA and NCCL at build "
    "time). Use \"gloo\" or \"mpi\" for CPU tensors, or build datapar against a CUDA libtorch (docs/building.md).";

}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store>, int, int, NcclOptions) {
  throw InvalidArgumentError(std::string("new_nccl_process_group: ") + kNcclNotBuilt);
}

namespace detail {

Backend nccl_backend() { return Backend{"nccl", kNcclNotBuilt, nullptr, nullptr}; }

}  // namespace detail
}  // namespace datapar
