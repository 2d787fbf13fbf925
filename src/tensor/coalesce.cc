#include "tensor/coalesce.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace datapar::detail {
namespace {

// The members' memory as one flat tensor, when they lie back to back in it, in order;
// else undefined.
at::Tensor view_of_members(const std::vector<at::Tensor>& tensors, const std::vector<size_t>& members) {
  const at::Tensor& first = tensors[members.front()];
  int64_t numel = 0;
  for (size_t i : members) {
    const at::Tensor& t = tensors[i];
    if (!t.is_contiguous() || !t.storage().is_alias_of(first.storage()) || t.device() != first.device() ||
        t.storage_offset() != first.storage_offset() + numel) {
      return {};
    }
    numel += t.numel();
  }
  return at::empty({0}, first.options()).set_(first.storage(), first.storage_offset(), {numel}, {1});
}

}  // namespace

std::vector<FlatGroup> views_by_dtype(const std::vector<at::Tensor>& tensors) {
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
    group.flat = view_of_members(tensors, group.members);
    group.aliases = group.flat.defined();
  }
  return groups;
}

std::vector<FlatGroup> flatten_by_dtype(const std::vector<at::Tensor>& tensors, bool copy_values) {
  std::vector<FlatGroup> groups = views_by_dtype(tensors);
  for (FlatGroup& group : groups) {
    if (group.aliases) continue;
    if (!copy_values) {
      int64_t numel = 0;
      for (size_t i : group.members) numel += tensors[i].numel();
      group.flat = at::empty({numel}, tensors[group.members.front()].options());
      continue;
    }
    std::vector<at::Tensor> pieces;
    pieces.reserve(group.members.size());
    for (size_t i : group.members) pieces.push_back(tensors[i].reshape({-1}));
    group.flat = at::cat(pieces);
  }
  return groups;
}

void pack_back_to_back(const std::vector<at::Tensor>& tensors) {
  const at::NoGradGuard no_grad;
  for (const FlatGroup& group : views_by_dtype(tensors)) {
    if (group.aliases) continue;  // packed already
    int64_t numel = 0;
    bool packable = true;
    const at::Tensor& first = tensors[group.members.front()];
    for (size_t i : group.members) {
      packable = packable && tensors[i].is_contiguous() && tensors[i].device() == first.device();
      numel += tensors[i].numel();
    }
    if (!packable) continue;
    const at::Tensor flat = at::empty({numel}, first.options());
    int64_t offset = 0;
    for (size_t i : group.members) {
      at::Tensor t = tensors[i];
      const at::Tensor piece = flat.narrow(0, offset, t.numel()).view(t.sizes());
      piece.copy_(t);
      t.set_data(piece);  // the same Tensor, new memory
      offset += t.numel();
    }
  }
}

void unflatten_into(const FlatGroup& group, const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  if (group.aliases && flat.data_ptr() == group.flat.data_ptr()) return;  // the members' own memory
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
