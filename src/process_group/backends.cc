// See backends.h. The #if for optional backends lives here and nowhere else.
#include "process_group/backends.h"

#include "datapar/config.h"
#include "datapar/error.h"

#if DATAPAR_HAVE_MPI
#include "process_group/mpi/process_group.h"
#endif
#if DATAPAR_HAVE_NCCL
#include "datapar/process_group/nccl.h"
#endif

namespace datapar::detail {
namespace {

std::vector<Backend> compiled_in() {
  std::vector<Backend> list;
  list.push_back({"gloo", nullptr,
                  [](std::shared_ptr<Store> store, int rank, const std::vector<int>& ranks, const BackendSettings& s) {
                    return new_gloo_process_group(std::move(store), rank, static_cast<int>(ranks.size()),
                                                  GlooOptions{s.gloo_hostname, s.timeout, s.shared_memory, s.stall_warning});
                  }});
#if DATAPAR_HAVE_MPI
  list.push_back({"mpi",
                  [] {
                    const MpiWorld world = mpi_world();
                    return JobShape{world.rank, world.size};
                  },
                  [](std::shared_ptr<Store>, int, const std::vector<int>& ranks, const BackendSettings& s) {
                    return new_mpi_process_group(ranks, MpiOptions{s.timeout, s.mpi_shared_memory});
                  }});
#endif
#if DATAPAR_HAVE_NCCL
  list.push_back({"nccl", nullptr,
                  [](std::shared_ptr<Store> store, int rank, const std::vector<int>& ranks, const BackendSettings& s) {
                    NcclOptions options;
                    options.timeout = s.timeout;
                    options.stall_warning = s.stall_warning;
                    options.local_rank = s.local_rank;
                    options.end_process_on_failure = s.nccl_end_process_on_failure;
                    return new_nccl_process_group(std::move(store), rank, static_cast<int>(ranks.size()), options);
                  }});
#endif
  return list;
}

}  // namespace

const Backend& find_backend(const std::string& name) {
  static const std::vector<Backend> backends = compiled_in();
  std::string names;
  for (const Backend& b : backends) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  if (name == "nccl") {
    throw InvalidArgumentError(
        "init_process_group: the nccl backend is not available in this build of datapar (it needs libtorch with "
        "CUDA and NCCL at build time). Use \"gloo\" or \"mpi\" for CPU tensors.");
  }
  if (name == "mpi") {
    throw InvalidArgumentError(
        "init_process_group: the mpi backend is not available in this build of datapar (CMake found no MPI "
        "library). Install one (Debian: apt-get install libopenmpi-dev openmpi-bin) and build datapar again, or "
        "use \"gloo\" for CPU tensors.");
  }
  throw InvalidArgumentError(
      str_cat("init_process_group: unknown backend \"", name, "\". Available in this build: ", names, "."));
}

}  // namespace datapar::detail
