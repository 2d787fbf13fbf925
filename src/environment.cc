// The process environment, the one place in the libraries that calls getenv for
// configuration. See environment.h.
#include "datapar/environment.h"

#include <cstdlib>

namespace datapar {

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

}  // namespace datapar
