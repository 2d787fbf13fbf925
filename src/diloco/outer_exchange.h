// The average of the ranks' pseudo-gradients that DiLoCo's outer step takes, sent in the
// outer dtype (DiLoCoOptions::outer_dtype): float32 as it is (one all-reduce), or bf16 or int8
// (Streaming DiLoCo's quantised exchange, Note [A quantised average]).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "datapar/process_group/process_group.h"

namespace datapar::detail {

// Elements per int8 scale: each block of this many is scaled by its largest magnitude.
inline constexpr int64_t kInt8Block = 256;

// The mean over `group` of `values` (flat, float32; every rank the same size), as every rank
// receives it: the same on every rank. `dtype`: "float32", "bf16" or "int8".
at::Tensor outer_average(ProcessGroup& group, const at::Tensor& values, const std::string& dtype);

// The bytes one rank sends for outer_average of `numel` elements over `ranks` ranks (what
// the benchmarks report beside the measured figure).
int64_t outer_average_bytes(int64_t numel, int ranks, const std::string& dtype);

}  // namespace datapar::detail
