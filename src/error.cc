// Out-of-line pieces of error.h.
#include "datapar/error.h"

namespace datapar::detail {

void throw_internal_error(const char* file, int line, const char* condition,
                          const std::string& detail) {
  throw Error(str_cat("datapar internal error at ", file, ":", line, ": ", condition,
                      " does not hold", detail.empty() ? "" : ": ", detail,
                      ". This is a bug in datapar; please report it with this message."));
}

}  // namespace datapar::detail
