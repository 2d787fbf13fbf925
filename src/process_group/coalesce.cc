#include "process_group/coalesce.h"

#include <ATen/ATen.h>

namespace datapar::detail {

std::vector<FlatGroup> flatten_by_dtype(const std::vector<at::Tensor>& tensors) {
  std::vector<FlatGroup> groups;
  std::vector<at::ScalarType> types;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t g = 0;
    while (g < types.size() && types[g] != tensors[i].scalar_type()) ++g;
    if (g == types.size()) {
      types.push_back(tensors[i].scalar_type());
      groups.emplace_back();
    }
    groups[g].members.push_back(i);
  }
  for (FlatGroup& group : groups) {
    std::vector<at::Tensor> pieces;
    pieces.reserve(group.members.size());
    for (size_t i : group.members) pieces.push_back(tensors[i].reshape({-1}));
    group.flat = at::cat(pieces);
  }
  return groups;
}

void unflatten_into(const FlatGroup& group, const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (size_t i : group.members) {
    at::Tensor& t = tensors[i];
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (at::Tensor& out : outputs) {
    out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
    offset += out.numel();
  }
}

}  // namespace datapar::detail
