// The sample count of a forward call, as DDP and FSDP take it for averaging by samples.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <type_traits>

namespace datapar::detail {

// Rows of the first tensor among `args` (dim 0), or 1 when there is none.
template <typename... Args>
int64_t leading_rows(const Args&... args) {
  int64_t rows = -1;
  auto visit = [&rows](const auto& arg) {
    if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, at::Tensor>) {
      if (rows < 0 && arg.defined() && arg.dim() > 0) rows = arg.size(0);
    }
  };
  (visit(args), ...);
  return rows < 0 ? 1 : rows;
}

}  // namespace datapar::detail
