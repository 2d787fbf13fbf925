// See fsdp_state_moves.h.
#include "ft/fsdp_state_moves.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/utils.h>

#include <string>
#include <type_traits>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "optim/state_key.h"
#include "serialization/torch_file.h"

namespace datapar::ft::detail {
namespace {

using Dict = c10::impl::GenericDict;

template <typename Map>
typename Map::key_type key_of(const at::Tensor& t) {
  return datapar::detail::optimizer_state_key<Map>(t);
}

}  // namespace

const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  const auto it = optimizer.state().find(key_of<StateMap>(param));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
               std::unique_ptr<torch::optim::OptimizerParamState> state) {
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  optimizer.state()[key_of<StateMap>(param)] = std::move(state);
}

datapar::detail::OptimizerKind movable_kind(const torch::optim::Optimizer& optimizer) {
  const datapar::detail::OptimizerKind kind = datapar::detail::optimizer_kind(optimizer);
  DATAPAR_CHECK(kind != datapar::detail::OptimizerKind::kOther,
                "ft::FaultTolerantFsdp: supports SGD, Adam and AdamW, whose state it can move between members; the "
                "factory made ",
                datapar::detail::optimizer_kind_name(kind), ".");
  return kind;
}

void load_whole_state(ProcessGroup& group, int root, const StateDict& model, const OptimizerState& optimizer,
                      const FsdpParts& next) {
  std::string bytes;
  if (group.rank() == root) {
    Dict dict(c10::StringType::get(), c10::TensorType::get());
    for (const auto& item : model) dict.insert(item.key(), item.value());
    Dict state(c10::StringType::get(), c10::AnyType::get());
    state.insert("model", dict);
    state.insert("optimizer", optimizer);
    bytes = datapar::detail::torch_save_bytes(state);
  }
  bytes = datapar::broadcast_bytes(group, root, bytes);
  const c10::IValue loaded = datapar::detail::torch_load_bytes(bytes.data(), bytes.size());
  DATAPAR_CHECK(loaded.isGenericDict(), "ft::FaultTolerantFsdp: the state a member sent is not a dict.");
  const Dict state = loaded.toGenericDict();
  StateDict whole;
  for (const auto& e : state.at("model").toGenericDict()) whole.insert(e.key().toStringRef(), e.value().toTensor());
  next.load_model(whole);
  next.load_optimizer(*next.optimizer, state.at("optimizer").toGenericDict());
}

void take_buffers(ProcessGroup& group, int source, const FsdpParts* current, const FsdpParts& next) {
  const bool here = group.rank() == source;
  DATAPAR_CHECK(!here || current != nullptr, "ft::FaultTolerantFsdp: the member that gives the buffers has none.");
  std::vector<at::Tensor> buffers;
  for (const at::Tensor& b : (here ? current->module : next.module)->buffers()) buffers.push_back(b.detach());
  if (!buffers.empty()) group.broadcast_coalesced(buffers, source)->wait();
  if (!here) return;
  const std::vector<at::Tensor> into = next.module->buffers();
  const torch::NoGradGuard no_grad;
  for (size_t i = 0; i < into.size(); ++i) into[i].copy_(buffers[i]);
}

}  // namespace datapar::ft::detail
