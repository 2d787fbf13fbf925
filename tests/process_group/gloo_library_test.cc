// Which gloo datapar's Gloo backend runs (Note [Two copies of gloo] in
// src/process_group/gloo/transport_plugin.cc): always the system's libgloo.so.0, the library its
// headers come from; and where libtorch carries a gloo of its own, each copy keeps its own
// symbols, with no interposition either way.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "datapar/config.h"
#include "process_group/gloo/transport.h"

namespace datapar {
namespace {

// gloo::allreduce(gloo::AllreduceOptions const&): defined by Debian's libgloo and by
// libtorch_cpu 2.x alike.
constexpr const char* kSharedGlooSymbol = "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE";

std::string library_of(const void* address) {
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "(none)";
  return info.dli_fname;
}

TEST(GlooLibrary, TheBackendRunsTheSystemsLibgloo) {
  const std::string library = detail::gloo_library();
  EXPECT_NE(library.find("libgloo.so"), std::string::npos) << "the Gloo backend's gloo calls go to " << library;
}

TEST(GlooLibrary, LibtorchsGlooSymbolsAreNotInterposed) {
  (void)detail::gloo_library();  // loads the plugin where there is one
  const std::string global = library_of(::dlsym(RTLD_DEFAULT, kSharedGlooSymbol));
  if (DATAPAR_GLOO_PLUGIN) {
    // The process's global scope (libtorch's own calls) still finds libtorch's gloo.
    EXPECT_NE(global.find("libtorch_cpu"), std::string::npos) << "gloo::allreduce in the global scope: " << global;
  } else {
    // One gloo in the process: libtorch itself links the system's.
    EXPECT_NE(global.find("libgloo.so"), std::string::npos) << "gloo::allreduce in the global scope: " << global;
  }
}

}  // namespace
}  // namespace datapar
