// Coalescing: many tensors sent as one message per dtype, for the *_coalesced collectives.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace datapar::detail {

// Tensors of one dtype, flattened into one contiguous buffer in the order given.
struct FlatGroup {
  at::Tensor flat;
  std::vector<size_t> members;  // indices into the tensor list
};

// Groups `tensors` by dtype (groups in order of first appearance) and flattens each.
std::vector<FlatGroup> flatten_by_dtype(const std::vector<at::Tensor>& tensors);

// Copies each member's slice of `group.flat` (or of `flat`, a same-sized replacement such
// as a widened copy) back into its tensor.
void unflatten_into(const FlatGroup& group, const at::Tensor& flat, std::vector<at::Tensor>& tensors);

// Copies consecutive numel-sized pieces of `flat` into `outputs` (an all_gather's or a
// gather's result, rank by rank).
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& outputs);

}  // namespace datapar::detail
