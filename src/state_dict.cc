// State dicts and their files. See state_dict.h.
#include "datapar/state_dict.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "datapar/error.h"
#include "serialization/torch_file.h"

namespace datapar {
namespace {

const char kPrefix[] = "module.";

void add_module(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) out.insert(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) out.insert(prefix + b.key(), b.value());
  }
  for (const auto& child : module.named_children()) add_module(*child.value(), prefix + child.key() + ".", out);
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  add_module(module, "", out);
  return out;
}

void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  bool prefixed = !state.is_empty();
  for (const auto& item : state) prefixed = prefixed && item.key().rfind(kPrefix, 0) == 0;
  const size_t strip = prefixed ? sizeof(kPrefix) - 1 : 0;

  StateDict target = state_dict(module);
  std::vector<std::string> unexpected;
  std::vector<std::string> loaded;
  at::NoGradGuard no_grad;
  for (const auto& item : state) {
    const std::string name = item.key().substr(strip);
    at::Tensor* dst = target.find(name);
    if (dst == nullptr) {
      unexpected.push_back(name);
      continue;
    }
    DATAPAR_CHECK(dst->sizes() == item.value().sizes(), "load_state_dict: ", name, " has shape ",
                  item.value().sizes(), " in the state dict but ", dst->sizes(), " in ", module.name(),
                  ". Load it into the model it was saved from.");
    dst->copy_(item.value());
    loaded.push_back(name);
  }
  if (!strict) return;
  std::vector<std::string> missing;
  for (const auto& item : target) {
    if (std::find(loaded.begin(), loaded.end(), item.key()) == loaded.end()) missing.push_back(item.key());
  }
  if (missing.empty() && unexpected.empty()) return;
  std::ostringstream msg;
  msg << "load_state_dict: the state dict does not match " << module.name() << ".";
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    msg << " " << what << ":";
    for (size_t i = 0; i < keys.size() && i < 10; ++i) msg << (i ? ", " : " ") << keys[i];
    if (keys.size() > 10) msg << " and " << keys.size() - 10 << " more";
    msg << ".";
  };
  list("Missing keys", missing);
  list("Unexpected keys", unexpected);
  msg << " Load a state dict of the same model, or pass strict=false to load the keys that match.";
  throw InvalidArgumentError(msg.str());
}

void save_state_dict(const StateDict& state, const std::string& path) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : state) dict.insert(item.key(), item.value());
  detail::torch_save(dict, path);
}

StateDict load_state_dict_file(const std::string& path) {
  const c10::IValue value = detail::torch_load(path);
  if (!value.isGenericDict()) {
    throw CheckpointError(detail::str_cat(path, ": holds a ", detail::python_type_name(value),
                                          ", not a dict of tensors. Save model.state_dict(), not the model."));
  }
  const auto dict = value.toGenericDict();
  if (dict.contains("format") && dict.contains("model")) {
    throw CheckpointError(detail::str_cat(path, ": is a checkpoint, not a state dict. Load it with train::load_checkpoint,",
                                          " or take its \"model\" entry."));
  }
  StateDict state;
  for (const auto& entry : dict) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      throw CheckpointError(detail::str_cat(path, ": entry ", entry.key(), " is a ", detail::python_type_name(entry.value()),
                                            ", not a named tensor; expected a state dict."));
    }
    state.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  return state;
}

}  // namespace datapar
