// See fully_shard.h.
#include "datapar/fsdp/fully_shard.h"

#include <unordered_set>

#include "datapar/error.h"
#include "fsdp/fsdp_unit.h"

namespace datapar::detail {
namespace {

constexpr const char* kHandleName = "_fsdp_unit";

bool is_unit(const torch::nn::Module& module) {
  return dynamic_cast<const ShardedModule*>(&module) != nullptr || unit_of(module) != nullptr;
}

// Depth first, not into units: `own(module)` lists a module's own tensors.
template <typename Own>
void collect(const torch::nn::Module& module, const Own& own, std::unordered_set<const void*>& seen,
             std::vector<at::Tensor>& out) {
  for (const at::Tensor& t : own(module)) {
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  for (const std::shared_ptr<torch::nn::Module>& child : module.children()) {
    if (!is_unit(*child)) collect(*child, own, seen, out);
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

FsdpUnitHandle::FsdpUnitHandle(std::shared_ptr<FsdpUnit> unit) : Module("datapar::FsdpUnit"), unit_(std::move(unit)) {}

FsdpUnitHandle::~FsdpUnitHandle() = default;

std::shared_ptr<FsdpUnit> unit_of(const torch::nn::Module& module) {
  for (const auto& child : module.named_children()) {
    if (child.key() != kHandleName) continue;
    if (const auto* handle = dynamic_cast<const FsdpUnitHandle*>(child.value().get())) return handle->unit();
  }
  return nullptr;
}

std::shared_ptr<FsdpUnit> shard_in_place(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group,
                                         const FsdpOptions& options) {
  DATAPAR_CHECK(!is_unit(module), "fully_shard: ", module.name(), " is an FSDP unit already; shard each module once.");
  auto unit = std::make_shared<FsdpUnit>(module.name(), unit_parameters(module), std::move(group), options);
  unit->install_hooks();
  unit->cast_buffers(unit_buffers(module));
  module.register_module(kHandleName, std::make_shared<FsdpUnitHandle>(unit));
  return unit;
}

int shard_in_place_where(torch::nn::Module& root, const std::function<bool(const torch::nn::Module&)>& pick,
                         const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options) {
  int made = 0;
  const std::function<void(torch::nn::Module&)> visit = [&](torch::nn::Module& module) {
    for (const std::shared_ptr<torch::nn::Module>& child : module.children()) {
      if (is_unit(*child) || dynamic_cast<const FsdpUnitHandle*>(child.get()) != nullptr) continue;
      if (pick(*child)) {
        shard_in_place(*child, group, options);
        ++made;
      } else {
        visit(*child);
      }
    }
  };
  visit(root);
  return made;
}

ShardedModule::ShardedModule(std::shared_ptr<torch::nn::Module> wrapped, std::shared_ptr<ProcessGroup> group,
                             FsdpOptions options)
    : WrapperModule(std::move(wrapped), "datapar::Sharded") {
  // In place first (the wrapper lists the children it had before the handle came).
  unit_ = shard_in_place(*this->wrapped(), std::move(group), options);
}

ShardedModule::~ShardedModule() = default;

void ShardedModule::pre_forward() { unit_->pre_forward(); }

void ShardedModule::post_forward(const c10::IValue& outputs) { unit_->post_forward(outputs); }

}  // namespace datapar::detail
