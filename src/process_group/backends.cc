// See backends.h.
#include "process_group/backends.h"

#include "datapar/error.h"

namespace datapar::detail {

const Backend& find_backend(const std::string& name) {
  static const std::vector<Backend> backends = {gloo_backend(), mpi_backend(), nccl_backend()};
  std::string built;
  for (const Backend& b : backends) {
    if (b.name == name) {
      if (!b.not_built.empty()) throw InvalidArgumentError("init_process_group: " + b.not_built);
      return b;
    }
    if (b.not_built.empty()) built += (built.empty() ? "" : ", ") + b.name;
  }
  throw InvalidArgumentError(
      str_cat("init_process_group: unknown backend \"", name, "\". Available in this build: ", built, "."));
}

}  // namespace datapar::detail
