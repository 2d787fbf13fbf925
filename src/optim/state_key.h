// How a libtorch optimizer keys its per-parameter state: by the parameter's TensorImpl,
// libtorch 1.x as a string (c10::guts::to_string of the pointer, i.e. operator<<), 2.x as
// the pointer itself. `Map` is the optimizer's state() map type.
#pragma once

#include <ATen/core/Tensor.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace datapar::detail {

template <typename Map>
typename Map::key_type optimizer_state_key(const at::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << static_cast<const void*>(param.unsafeGetTensorImpl());
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace datapar::detail
