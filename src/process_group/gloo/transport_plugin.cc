// Loads the Gloo backend's plugin where libtorch carries a gloo of its own.
//
// Note [Two copies of gloo]
// Debian's libtorch links the system's libgloo.so.0; pip's torch and pytorch.org's zip build
// gloo into libtorch_cpu.so and export its symbols (about 300, of which 214 share a name with
// Debian's 2022 libgloo, e.g. gloo::allreduce and gloo::rendezvous::Context's constructor).
// The two copies differ in version, so their classes differ in layout. Linked side by side,
// every shared name would bind to whichever library the dynamic linker met first: datapar's
// calls could run torch's gloo with Debian's struct layouts, or torch's own calls Debian's.
// Neither is acceptable, and torch ships no gloo headers to build against its copy.
//
// So, on such a Torch, datapar keeps Debian's gloo (the headers it is built with) and runs it
// in a scope of its own: the backend is built as the module libdatapar_gloo.so, linked to
// libgloo.so.0 first, and loaded with RTLD_LOCAL | RTLD_DEEPBIND. DEEPBIND makes the module
// and libgloo look up symbols in their own dependencies before the process's global scope,
// so their gloo names bind to libgloo.so.0; RTLD_LOCAL keeps libgloo.so.0 out of the global
// scope, so libtorch's gloo names keep binding to its own copy. Both bindings are checked by
// a test (GlooLibrary.*). Sanitizer runtimes refuse RTLD_DEEPBIND; sanitizer builds use
// Debian's libtorch, where the backend is linked in directly (transport_linked.cc).
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "datapar/error.h"
#include "process_group/gloo/transport.h"

namespace datapar {
namespace detail {
namespace {

// The directory of the library this function is in (libdatapar.so), with a trailing '/'.
std::string own_directory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash + 1);
}

const GlooPluginApi& plugin() {
  static const GlooPluginApi* api = [] {
    const std::string path = own_directory() + kGlooPluginFile;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      throw Error(str_cat("datapar: cannot load the Gloo backend (", path, "): ", why ? why : "unknown error",
                          ". It is built and installed beside libdatapar.so; build or install datapar again."));
    }
    using Entry = const GlooPluginApi* (*)();
    const auto entry = reinterpret_cast<Entry>(::dlsym(handle, kGlooPluginEntry));
    const GlooPluginApi* found = entry ? entry() : nullptr;
    if (found == nullptr || found->version != kGlooPluginVersion) {
      throw Error(str_cat("datapar: ", path, " is not the Gloo plugin of this build of datapar (entry ",
                          kGlooPluginEntry, " missing or of another version); build or install datapar again."));
    }
    return found;  // never unloaded: groups and their threads may outlive any caller
  }();
  return *api;
}

}  // namespace

std::string gloo_library() { return plugin().library(); }

std::shared_ptr<ProcessGroup> new_gloo_tcp_group(std::shared_ptr<Store> store, int rank, int size,
                                                 GlooOptions options) {
  return plugin().make_process_group(std::move(store), rank, size, std::move(options));
}

}  // namespace detail

}  // namespace datapar
