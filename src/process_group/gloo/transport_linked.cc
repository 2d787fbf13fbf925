// The Gloo backend linked into libdatapar: where libtorch itself links the system's libgloo
// (Debian), so there is one gloo in the process and nothing to keep apart.
#include "process_group/gloo/transport.h"

namespace datapar::detail {

std::shared_ptr<ProcessGroup> new_gloo_tcp_group(std::shared_ptr<Store> store, int rank, int size,
                                                 GlooOptions options) {
  return make_gloo_process_group(std::move(store), rank, size, std::move(options));
}

std::string gloo_library() { return gloo_library_of_this_backend(); }

}  // namespace datapar::detail
