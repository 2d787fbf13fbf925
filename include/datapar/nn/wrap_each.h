// Modules that wrap a submodule in place, as PyTorch's FSDP units and checkpoint wrappers
// do, and the rewrite of a model's Sequentials that puts them there.
//
// A wrapper lists the wrapped module's own parameters, buffers and children under their own
// names, so the model's parameter and state-dict names stay those of the unwrapped model
// ("layers.0.weight", never "layers.0.module.weight").
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace datapar::detail {

class WrapperModule : public torch::nn::Module {
 public:
  // Also sets the wrapped module's mode: its forward may read is_training() itself.
  void train(bool on = true) override;
  void pretty_print(std::ostream& stream) const override;
  const std::shared_ptr<torch::nn::Module>& wrapped() const { return wrapped_; }

 protected:
  // `kind` names the wrapper in printouts ("datapar::Sharded").
  WrapperModule(std::shared_ptr<torch::nn::Module> wrapped, const std::string& kind);

 private:
  std::shared_ptr<torch::nn::Module> wrapped_;
};

// Every Sequential in `root`'s tree, innermost first (so that wrappers nested in wrapped
// modules are made before the wrappers around them).
std::vector<torch::nn::SequentialImpl*> sequentials_innermost_first(torch::nn::Module& root);

// Replaces each element of type Units (Impl types) of every Sequential in `root`'s tree by
// wrap(std::shared_ptr<Unit>), a module with a forward, in place. Returns how many.
template <typename... Units, typename Wrap>
int wrap_each(torch::nn::Module& root, const Wrap& wrap) {
  static_assert(sizeof...(Units) > 0, "name the module types (Impl types) to wrap");
  int wrapped = 0;
  for (torch::nn::SequentialImpl* sequential : sequentials_innermost_first(root)) {
    const auto children = sequential->named_children();
    torch::nn::SequentialImpl fresh;
    bool changed = false;
    size_t i = 0;
    for (const torch::nn::AnyModule& element : *sequential) {
      const std::string& name = children[i++].key();
      const std::shared_ptr<torch::nn::Module> module = element.ptr();
      auto replaced = [&](auto* unit_type) {
        using Unit = std::remove_pointer_t<decltype(unit_type)>;
        auto unit = std::dynamic_pointer_cast<Unit>(module);
        if (!unit) return false;
        fresh.push_back(name, wrap(std::move(unit)));
        return true;
      };
      if ((replaced(static_cast<Units*>(nullptr)) || ...)) {
        changed = true;
        ++wrapped;
      } else {
        fresh.push_back(name, element);
      }
    }
    if (!changed) continue;
    fresh.train(sequential->is_training());
    // Module's assignment: the Sequential's holders elsewhere (its parent's member) see it.
    *sequential = std::move(fresh);
  }
  return wrapped;
}

}  // namespace datapar::detail
