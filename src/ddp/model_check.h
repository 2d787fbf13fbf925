// Checks that every rank holds the same model before DDP starts.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::detail {

// A collective: gathers every rank's (name, shape, dtype) list and throws
// InvalidArgumentError on every rank, naming the first entry where some rank differs from
// rank 0 and the ranks that differ, if the lists are not identical.
void check_same_model(ProcessGroup& group, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

}  // namespace datapar::detail
