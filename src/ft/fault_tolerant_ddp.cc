// The non-template parts of FaultTolerantDdp. See datapar/ft/fault_tolerant_ddp.h.
#include "datapar/ft/fault_tolerant_ddp.h"

#include <ATen/core/Dict.h>
#include <c10/util/Exception.h>

#include "datapar/state_dict.h"
#include "datapar/train/optimizer_state.h"
#include "serialization/torch_file.h"

namespace datapar::ft::detail {
namespace {

using datapar::detail::str_cat;
using Dict = c10::impl::GenericDict;

c10::IValue field(const Dict& state, const char* key) {
  const auto it = state.find(key);
  if (it == state.end()) throw CheckpointError(str_cat("ft: the state a member sent has no \"", key, "\" entry."));
  return it->value();
}

}  // namespace

std::string save_training_state(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                                int64_t step) {
  Dict model(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : state_dict(module)) model.insert(item.key(), item.value());
  Dict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("model", model);
  state.insert("optimizer", train::optimizer_state_dict(optimizer));
  state.insert("step", step);
  return datapar::detail::torch_save_bytes(state);
}

int64_t load_training_state(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::string& bytes) {
  const c10::IValue root = datapar::detail::torch_load_bytes(bytes.data(), bytes.size());
  if (!root.isGenericDict()) throw CheckpointError("ft: the state a member sent is not a dict.");
  const Dict state = root.toGenericDict();
  const c10::IValue model = field(state, "model");
  const c10::IValue optimizer_state = field(state, "optimizer");
  const c10::IValue step = field(state, "step");
  if (!model.isGenericDict() || !optimizer_state.isGenericDict() || !step.isInt()) {
    throw CheckpointError("ft: the state a member sent has entries of the wrong types.");
  }
  StateDict tensors;
  for (const auto& e : model.toGenericDict()) {
    if (!e.key().isString() || !e.value().isTensor()) throw CheckpointError("ft: a model entry is not a named tensor.");
    tensors.insert(e.key().toStringRef(), e.value().toTensor());
  }
  load_state_dict(module, tensors, /*strict=*/true);
  train::load_optimizer_state_dict(optimizer, optimizer_state.toGenericDict());
  return step.toInt();
}

}  // namespace datapar::ft::detail
