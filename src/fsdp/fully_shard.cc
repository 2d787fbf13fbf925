// See fully_shard.h.
#include "datapar/fsdp/fully_shard.h"

#include <unordered_set>

#include "datapar/error.h"
#include "fsdp/fsdp_unit.h"

namespace datapar::detail {
namespace {

// Depth first, not into units: `own(module)` lists a module's own tensors.
template <typename Own>
void collect(const torch::nn::Module& module, const Own& own, std::unordered_set<const void*>& seen,
             std::vector<at::Tensor>& out) {
  for (const at::Tensor& t : own(module)) {
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  for (const std::shared_ptr<torch::nn::Module>& child : module.children()) {
    if (dynamic_cast<const ShardedModule*>(child.get()) == nullptr) collect(*child, own, seen, out);
  }
}

}  // namespace

std::vector<at::Tensor> unit_parameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> out;
  collect(
      module,
      [](const torch::nn::Module& m) {
        std::vector<at::Tensor> trainable;
        for (const at::Tensor& p : m.parameters(/*recurse=*/false)) {
          if (p.requires_grad()) trainable.push_back(p);
        }
        return trainable;
      },
      seen, out);
  return out;
}

std::vector<at::Tensor> unit_buffers(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> out;
  collect(
      module, [](const torch::nn::Module& m) { return m.buffers(/*recurse=*/false); }, seen, out);
  return out;
}

ShardedModule::ShardedModule(std::shared_ptr<torch::nn::Module> wrapped, std::shared_ptr<ProcessGroup> group,
                             FsdpOptions options)
    : WrapperModule(std::move(wrapped), "datapar::Sharded") {
  DATAPAR_CHECK(dynamic_cast<const ShardedModule*>(this->wrapped().get()) == nullptr,
                "fully_shard: ", this->wrapped()->name(), " is a unit already.");
  unit_ =
      std::make_shared<FsdpUnit>(this->wrapped()->name(), unit_parameters(*this->wrapped()), std::move(group), options);
  unit_->install_hooks();
  unit_->cast_buffers(unit_buffers(*this->wrapped()));
}

ShardedModule::~ShardedModule() = default;

void ShardedModule::pre_forward() { unit_->pre_forward(); }

void ShardedModule::post_forward(const c10::IValue& outputs) { unit_->post_forward(outputs); }

}  // namespace datapar::detail
