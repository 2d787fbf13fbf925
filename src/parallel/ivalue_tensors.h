// Walking the tensors inside nested IValues (lists, tuples, string-keyed dicts).
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <vector>

namespace datapar::detail {

// Appends every tensor in `value`, depth first.
void collect_tensors(const c10::IValue& value, std::vector<at::Tensor>& out);

// A copy of `value` with every tensor t replaced by fn(t); other values are kept.
c10::IValue map_tensors(const c10::IValue& value, const std::function<at::Tensor(const at::Tensor&)>& fn);

}  // namespace datapar::detail
