// The Gloo backend's entry points inside datapar, and the plugin that carries them where
// libtorch has a gloo of its own (see Note [Two copies of gloo] in transport_plugin.cc).
#pragma once

#include <memory>
#include <string>

#include "datapar/process_group/gloo.h"

namespace datapar::detail {

// Gloo's TCP transport alone: the group new_gloo_process_group() wraps in shared memory
// (src/process_group/shared_memory_group.h). Defined in transport_linked.cc or transport_plugin.cc.
std::shared_ptr<ProcessGroup> new_gloo_tcp_group(std::shared_ptr<Store> store, int rank, int size,
                                                 GlooOptions options);

// Defined in process_group.cc, next to the backend itself.
std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                      GlooOptions options);
// The file of the gloo library whose code the backend runs (as the dynamic linker bound it).
std::string gloo_library_of_this_backend();

// The file of the gloo library datapar's Gloo backend runs on (loads the plugin where there is
// one), for the tests that check which gloo runs.
std::string gloo_library();

// What the plugin hands over: the two functions above. Both sides are built together, from the
// same headers, so C++ types may cross.
struct GlooPluginApi {
  int version;
  std::shared_ptr<ProcessGroup> (*make_process_group)(std::shared_ptr<Store> store, int rank, int size,
                                                      GlooOptions options);
  std::string (*library)();
};
inline constexpr int kGlooPluginVersion = 1;
inline constexpr const char* kGlooPluginEntry = "datapar_gloo_plugin";
inline constexpr const char* kGlooPluginFile = "libdatapar_gloo.so";

}  // namespace datapar::detail
