// The entry of libdatapar_gloo.so, the plugin that carries the Gloo backend where libtorch has a
// gloo of its own. See Note [Two copies of gloo] in transport_plugin.cc.
#include "process_group/gloo/transport.h"

extern "C" __attribute__((visibility("default"))) const datapar::detail::GlooPluginApi* datapar_gloo_plugin() {
  static const datapar::detail::GlooPluginApi api{datapar::detail::kGlooPluginVersion,
                                                  &datapar::detail::make_gloo_process_group,
                                                  &datapar::detail::gloo_library_of_this_backend};
  return &api;
}
