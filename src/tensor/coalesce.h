// Coalescing: many tensors sent as one message per dtype, for the *_coalesced collectives.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace datapar::detail {

// Tensors of one dtype, flattened into one contiguous buffer in the order given.
struct FlatGroup {
  at::Tensor flat;
  std::vector<size_t> members;  // indices into the tensor list
  // `flat` is the members' own memory: they lie back to back, in order, in one storage
  // (one contiguous tensor, or ZeRO's parameters, zero_redundancy_optimizer.h). Nothing
  // was copied in, and nothing needs copying out.
  bool aliases = false;
};

// Groups `tensors` by dtype (groups in order of first appearance); a group's `flat` is its
// members' own memory where they lie back to back (aliases), and undefined elsewhere. Makes
// no buffer and copies nothing.
std::vector<FlatGroup> views_by_dtype(const std::vector<at::Tensor>& tensors);

// Groups `tensors` by dtype (groups in order of first appearance) and flattens each: into
// a new buffer, or, where a group's members lie back to back in one storage, a view of
// them (FlatGroup::aliases). `copy_values` false: a new buffer is left uninitialised, for
// a collective that overwrites it (a broadcast's receivers).
std::vector<FlatGroup> flatten_by_dtype(const std::vector<at::Tensor>& tensors, bool copy_values = true);

// Copies each member's slice of `group.flat` (or of `flat`, a same-sized replacement such
// as a widened copy) back into its tensor; nothing when `flat` is the members' own memory.
void unflatten_into(const FlatGroup& group, const at::Tensor& flat, std::vector<at::Tensor>& tensors);

// Moves `tensors` of each dtype into one new buffer, back to back in their order, each a
// view of its piece, so that the groups above alias them from then on. The same Tensor
// objects (modules and optimizers holding them see it), the same values, new memory. A
// dtype whose tensors are not all contiguous and on one device is left where it is.
void pack_back_to_back(const std::vector<at::Tensor>& tensors);

// Copies consecutive numel-sized pieces of `flat` into `outputs` (an all_gather's or a
// gather's result, rank by rank).
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& outputs);

}  // namespace datapar::detail
