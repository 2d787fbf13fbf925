// See fsdp_optimizer_state.h.
#include "fsdp/fsdp_optimizer_state.h"

#include <ATen/ATen.h>

#include <string>
#include <unordered_map>
#include <utility>

#include "datapar/error.h"
#include "fsdp/fsdp_unit.h"

namespace datapar::detail {
namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;

constexpr const char* kWhat = "FullyShardedDataParallel: optimizer state: ";

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

// The optimizer's shards, in its order, as units.
std::vector<const FsdpUnit*> shards_of(const std::vector<std::shared_ptr<FsdpUnit>>& units,
                                       const torch::optim::Optimizer& optimizer) {
  DATAPAR_CHECK(optimizer.param_groups().size() == 1, kWhat, "the optimizer has ", optimizer.param_groups().size(),
                " parameter groups; this version converts an optimizer with one, over fsdp.parameters().");
  std::vector<const FsdpUnit*> shards;
  for (const at::Tensor& p : optimizer.param_groups()[0].params()) {
    const FsdpUnit* found = nullptr;
    for (const auto& unit : units) {
      if (unit->shard().unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) found = unit.get();
    }
    DATAPAR_CHECK(found != nullptr, kWhat, "the optimizer holds a tensor that is not one of this model's shards; ",
                  "build it over fsdp.parameters().");
    shards.push_back(found);
  }
  return shards;
}

// The unsharded model's parameter numbers, as module.parameters() lists them.
std::unordered_map<const void*, int64_t> parameter_numbers(const torch::nn::Module& module) {
  std::unordered_map<const void*, int64_t> numbers;
  int64_t i = 0;
  for (const at::Tensor& p : module.parameters()) numbers.emplace(p.unsafeGetTensorImpl(), i++);
  return numbers;
}

Dict only_group_with(const IValue& groups, c10::impl::GenericList params) {
  DATAPAR_CHECK(groups.isList() && groups.toListRef().size() == 1 && groups.toListRef()[0].isGenericDict(), kWhat,
                "\"param_groups\" must be a list of one group.");
  Dict group = groups.toListRef()[0].toGenericDict().copy();
  group.insert_or_assign("params", std::move(params));
  return group;
}

const IValue& entry(const Dict& d, const char* key) {
  const auto it = d.find(key);
  DATAPAR_CHECK(it != d.end(), kWhat, "no \"", key, "\".");
  return it->value();
}

}  // namespace

OptimizerState full_optimizer_state(const torch::nn::Module& module,
                                           const std::vector<std::shared_ptr<FsdpUnit>>& units,
                                           const torch::optim::Optimizer& optimizer) {
  const std::vector<const FsdpUnit*> shards = shards_of(units, optimizer);
  const std::unordered_map<const void*, int64_t> numbers = parameter_numbers(module);
  const OptimizerState sharded = optimizer_state_dict(optimizer);
  const Dict sharded_state = entry(sharded, "state").toGenericDict();
  Dict state = new_dict();
  for (size_t k = 0; k < shards.size(); ++k) {
    const auto found = sharded_state.find(static_cast<int64_t>(k));
    if (found == sharded_state.end()) continue;  // no step yet: none for its parameters either
    const FsdpUnit& unit = *shards[k];
    std::vector<Dict> per_param;  // each its own (a Dict's copies share their contents)
    for (size_t i = 0; i < unit.params().size(); ++i) per_param.push_back(new_dict());
    for (const auto& item : found->value().toGenericDict()) {
      const IValue& value = item.value();
      const bool elementwise =
          value.isTensor() && value.toTensor().dim() == 1 && value.toTensor().numel() == unit.shard().numel();
      if (!elementwise) {  // a scalar (Adam's step): each parameter's
        for (Dict& d : per_param) d.insert(item.key(), value);
        continue;
      }
      // Gathered whole, then cut into the parameters.
      const at::Tensor& part = value.toTensor();
      const at::Tensor whole = at::empty({unit.padded_numel()}, part.options());
      std::vector<at::Tensor> parts = whole.chunk(unit.group()->size());
      unit.group()->all_gather(parts, part.contiguous())->wait();
      int64_t offset = 0;
      for (size_t i = 0; i < unit.params().size(); ++i) {
        const at::Tensor& p = unit.params()[i];
        per_param[i].insert(item.key(), whole.narrow(0, offset, p.numel()).view(p.sizes()).clone());
        offset += p.numel();
      }
    }
    for (size_t i = 0; i < unit.params().size(); ++i) {
      state.insert(numbers.at(unit.params()[i].unsafeGetTensorImpl()), per_param[i]);
    }
  }
  c10::impl::GenericList params(c10::AnyType::get());
  for (int64_t i = 0; i < static_cast<int64_t>(numbers.size()); ++i) params.push_back(i);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(only_group_with(entry(sharded, "param_groups"), std::move(params)));
  OptimizerState out = new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void load_full_optimizer_state(const torch::nn::Module& module, const std::vector<std::shared_ptr<FsdpUnit>>& units,
                               torch::optim::Optimizer& optimizer, const OptimizerState& full) {
  const std::vector<const FsdpUnit*> shards = shards_of(units, optimizer);
  const std::unordered_map<const void*, int64_t> numbers = parameter_numbers(module);
  const IValue& full_state = entry(full, "state");
  DATAPAR_CHECK(full_state.isGenericDict(), kWhat, "\"state\" is not a dict.");
  const Dict states = full_state.toGenericDict();
  Dict state = new_dict();
  for (size_t k = 0; k < shards.size(); ++k) {
    const FsdpUnit& unit = *shards[k];
    std::vector<Dict> per_param;
    for (const at::Tensor& p : unit.params()) {
      const int64_t number = numbers.at(p.unsafeGetTensorImpl());
      const auto found = states.find(number);
      DATAPAR_CHECK(found == states.end() || found->value().isGenericDict(), kWhat, "parameter ", number,
                    "'s state is not a dict.");
      if (found != states.end()) per_param.push_back(found->value().toGenericDict());
    }
    if (per_param.empty()) continue;
    DATAPAR_CHECK(per_param.size() == unit.params().size(), kWhat, "some parameters of unit '", unit.name(),
                  "' have state and others none; it was not saved from this model's optimizer.");
    Dict shard = new_dict();
    for (const auto& item : per_param[0]) {
      const IValue& first = item.value();
      bool elementwise = !(item.key().isString() && item.key().toStringRef() == "step") && first.isTensor();
      for (size_t i = 0; elementwise && i < per_param.size(); ++i) {
        const auto it = per_param[i].find(item.key());
        DATAPAR_CHECK(it != per_param[i].end(), kWhat, "\"", item.key().toStringRef(),
                      "\" is missing for a parameter of unit '", unit.name(), "'.");
        elementwise = it->value().isTensor() && it->value().toTensor().sizes() == unit.params()[i].sizes();
      }
      if (!elementwise) {
        shard.insert(item.key(), first);
        continue;
      }
      at::Tensor whole = at::zeros({unit.padded_numel()}, first.toTensor().options());
      int64_t offset = 0;
      for (size_t i = 0; i < per_param.size(); ++i) {
        const at::Tensor t = per_param[i].at(item.key()).toTensor();
        whole.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
        offset += t.numel();
      }
      const int64_t size = unit.shard().numel();
      shard.insert(item.key(), whole.narrow(0, unit.group()->rank() * size, size).clone());
    }
    state.insert(static_cast<int64_t>(k), shard);
  }
  c10::impl::GenericList params(c10::AnyType::get());
  for (int64_t k = 0; k < static_cast<int64_t>(shards.size()); ++k) params.push_back(k);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(only_group_with(entry(full, "param_groups"), std::move(params)));
  OptimizerState sharded = new_dict();
  sharded.insert("state", state);
  sharded.insert("param_groups", groups);
  load_optimizer_state_dict(optimizer, sharded);
}

}  // namespace datapar::detail
