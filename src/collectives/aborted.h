// The one error of an operation on a group that was aborted (ProcessGroup::abort), whether
// it was issued after the abort or was in flight when it came.
#pragma once

#include <string>

#include "datapar/error.h"

namespace datapar::detail {

// `operation`: describe()'s "<what> on rank R of N (<backend>)".
inline std::string aborted_message(const std::string& operation) {
  return str_cat(operation, ": the group was aborted (ProcessGroup::abort: this process abandoned it, e.g. after a ",
                 "member failed); make a new group for what follows.");
}

}  // namespace datapar::detail
