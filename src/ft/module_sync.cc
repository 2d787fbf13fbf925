// Keeping a module's copies alike across members. See datapar/ft/module_sync.h.
#include "datapar/ft/module_sync.h"

#include "datapar/error.h"

namespace datapar::ft::detail {

void broadcast_buffers(torch::nn::Module& module, ProcessGroup& group, int root) {
  std::vector<at::Tensor> buffers;
  for (const at::Tensor& b : module.buffers()) buffers.push_back(b.detach());
  if (!buffers.empty() && group.size() > 1) group.broadcast_coalesced(std::move(buffers), root)->wait();
}

void broadcast_parameters(torch::nn::Module& module, ProcessGroup& group, int root) {
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& p : module.parameters()) tensors.push_back(p.detach());
  for (const at::Tensor& b : module.buffers()) tensors.push_back(b.detach());
  if (!tensors.empty() && group.size() > 1) group.broadcast_coalesced(std::move(tensors), root)->wait();
}

std::vector<at::Tensor> copy_buffers(const torch::nn::Module& module) {
  std::vector<at::Tensor> values;
  for (const at::Tensor& b : module.buffers()) values.push_back(b.detach().clone());
  return values;
}

void restore_buffers(torch::nn::Module& module, const std::vector<at::Tensor>& values) {
  const std::vector<at::Tensor> buffers = module.buffers();
  DATAPAR_CHECK(buffers.size() == values.size(), "ft: the module has ", buffers.size(), " buffers, not ",
                values.size());
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].detach().copy_(values[i]);
}

}  // namespace datapar::ft::detail
