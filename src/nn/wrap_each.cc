// See wrap_each.h.
#include "datapar/nn/wrap_each.h"

#include "datapar/error.h"

namespace datapar::detail {

WrapperModule::WrapperModule(std::shared_ptr<torch::nn::Module> wrapped, const std::string& kind)
    : torch::nn::Module(kind), wrapped_(std::move(wrapped)) {
  DATAPAR_CHECK(wrapped_ != nullptr, kind, ": the module to wrap is null.");
  for (const auto& item : wrapped_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : wrapped_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : wrapped_->named_children()) register_module(item.key(), item.value());
  torch::nn::Module::train(wrapped_->is_training());
}

void WrapperModule::train(bool on) {
  torch::nn::Module::train(on);
  wrapped_->train(on);
}

void WrapperModule::pretty_print(std::ostream& stream) const {
  stream << name() << "(";
  wrapped_->pretty_print(stream);
  stream << ")";
}

std::vector<torch::nn::SequentialImpl*> sequentials_innermost_first(torch::nn::Module& root) {
  std::vector<torch::nn::SequentialImpl*> found;
  if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&root)) found.push_back(sequential);
  for (const std::shared_ptr<torch::nn::Module>& module : root.modules(/*include_self=*/false)) {
    if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(module.get())) found.push_back(sequential);
  }
  return {found.rbegin(), found.rend()};  // modules() lists parents before children
}

}  // namespace datapar::detail
