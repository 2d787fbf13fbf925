// dcp::add_module / add_optimizer / apply_optimizer: models and optimizers as entries of a
// dcp::State, in the names of PyTorch's torch.distributed.checkpoint.state_dict.get_state_dict.
#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "datapar/dcp/checkpoint.h"
#include "optim/adopt_state.h"
#include "datapar/error.h"
#include "datapar/state_dict.h"
#include "datapar/optim/optimizer_state.h"
#include "dcp/optimizer_layout.h"
#include "optim/param_state.h"
#include "optim/state_key.h"

namespace datapar::dcp {
namespace {

using c10::IValue;
using datapar::detail::str_cat;
using Dict = c10::impl::GenericDict;
namespace optim = torch::optim;

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

// The optimizer's parameters, numbered across its groups as PyTorch numbers them, by name.
std::vector<std::string> parameter_names(const optim::Optimizer& optimizer, const torch::nn::Module& module) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  return detail::names_in(module, params, "dcp::add_optimizer: the optimizer");
}

}  // namespace

namespace detail {

std::vector<std::string> names_in(const torch::nn::Module& module, const std::vector<at::Tensor>& params,
                                  const std::string& holder) {
  std::unordered_map<const void*, std::string> names;
  for (const auto& p : module.named_parameters()) names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  std::vector<std::string> out;
  for (const at::Tensor& p : params) {
    const auto it = names.find(p.unsafeGetTensorImpl());
    DATAPAR_CHECK(it != names.end(), holder, " holds a parameter of shape ", p.sizes(),
                  " that is not the module's. Give the module whose parameters it optimizes");
    out.push_back(it->second);
  }
  return out;
}

// State for every parameter that has none yet, as zeros (PyTorch's get_state_dict does the
// same by a step with zero gradients): what a load fills.
void create_missing_state(optim::Optimizer& optimizer) {
  const auto kind = datapar::detail::optimizer_kind(optimizer);
  using Map = std::decay_t<decltype(optimizer.state())>;
  for (auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      const auto key = datapar::detail::optimizer_state_key<Map>(p);
      if (optimizer.state().count(key) > 0) continue;
      std::unique_ptr<optim::OptimizerParamState> zeros = datapar::detail::zero_param_state(kind, p, group.options());
      if (zeros) optimizer.state()[key] = std::move(zeros);
    }
  }
}

// The param-group keys PyTorch 2.15's optimizers have and libtorch's do not, with the
// values a Python optimizer made with defaults holds: without them Python's dcp.load
// reports them missing. SGD's groups have "momentum"; Adam's and AdamW's "betas".
std::vector<std::pair<std::string, IValue>> python_only_keys(const Dict& group, bool adamw) {
  std::vector<std::pair<std::string, IValue>> keys = {
      {"foreach", IValue()}, {"differentiable", false}, {"fused", IValue()}};
  if (!group.contains("momentum")) {
    keys.emplace_back("capturable", false);
    keys.emplace_back("decoupled_weight_decay", adamw);
  }
  return keys;
}

void add_param_groups(State& state, const std::string& prefix, const OptimizerState& osd, bool adamw,
                      const std::function<c10::impl::GenericList(int64_t, const Dict&)>& params_of) {
  int64_t g = 0;
  for (const IValue& group : osd.at("param_groups").toListRef()) {
    auto put = [&](const std::string& key, IValue value) {
      state.put(str_cat(prefix, ".param_groups.", g, ".", key), std::move(value),
                {IValue(prefix), IValue("param_groups"), IValue(g), IValue(key)});
    };
    const Dict d = group.toGenericDict();
    for (const auto& kv : d) {
      if (kv.key().toStringRef() != "params") put(kv.key().toStringRef(), kv.value());
    }
    for (auto& extra : python_only_keys(d, adamw)) {
      if (!d.contains(extra.first)) put(extra.first, extra.second);
    }
    put("params", params_of(g, d));
    ++g;
  }
}

c10::impl::GenericList loaded_param_groups(const State& state, const std::string& prefix,
                                           const OptimizerState& current) {
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t g = 0;
  for (const IValue& group : current.at("param_groups").toListRef()) {
    Dict d = group.toGenericDict().copy();
    for (const auto& e : state.entries()) {
      if (e.path.size() == 4 && e.path[0].isString() && e.path[0].toStringRef() == prefix && e.path[1].isString() &&
          e.path[1].toStringRef() == "param_groups" && e.path[2].isInt() && e.path[2].toInt() == g &&
          e.path[3].isString() && e.path[3].toStringRef() != "params") {
        d.insert_or_assign(e.path[3], e.value);
      }
    }
    groups.push_back(d);
    ++g;
  }
  return groups;
}

}  // namespace detail

using detail::add_param_groups;
using detail::create_missing_state;
using detail::python_only_keys;

void add_module(State& state, const std::string& prefix, torch::nn::Module& module) {
  for (const auto& item : datapar::state_dict(module)) {
    state.put(prefix + "." + item.key(), item.value(), {IValue(prefix), IValue(item.key())});
  }
}

void add_optimizer_state(State& state, const std::string& prefix, const OptimizerState& osd,
                         const std::vector<std::string>& names, bool adamw) {
  for (const auto& item : osd.at("state").toGenericDict()) {
    const int64_t index = item.key().toInt();
    DATAPAR_CHECK(index >= 0 && index < static_cast<int64_t>(names.size()), "dcp: the optimizer state has parameter ",
                  index, " of ", names.size());
    const std::string& name = names[static_cast<size_t>(index)];
    for (const auto& kv : item.value().toGenericDict()) {
      const std::string& key = kv.key().toStringRef();
      state.put(str_cat(prefix, ".state.", name, ".", key), kv.value().toTensor(),
                {IValue(prefix), IValue("state"), IValue(name), IValue(key)});
    }
  }
  add_param_groups(state, prefix, osd, adamw, [&](int64_t, const Dict& group) {
    c10::impl::GenericList params(c10::AnyType::get());
    for (const IValue& index : group.at("params").toListRef()) {
      params.push_back(names.at(static_cast<size_t>(index.toInt())));
    }
    return params;
  });
}

void add_optimizer(State& state, const std::string& prefix, optim::Optimizer& optimizer, torch::nn::Module& module) {
  const std::vector<std::string> names = parameter_names(optimizer, module);
  create_missing_state(optimizer);
  add_optimizer_state(state, prefix, optimizer_state_dict(optimizer), names,
                      datapar::detail::optimizer_kind(optimizer) == datapar::detail::OptimizerKind::kAdamW);
}

OptimizerState optimizer_state_of(const State& state, const std::string& prefix,
                                         const std::vector<std::string>& names) {
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], static_cast<int64_t>(i));
  Dict per_param = new_dict();
  std::map<int64_t, Dict> groups;
  for (const State::Entry& e : state.entries()) {
    // The path says which parameter and key (names hold dots: "fc1.weight.exp_avg").
    if (e.path.size() != 4 || !e.path[0].isString() || e.path[0].toStringRef() != prefix || !e.path[1].isString() ||
        !e.path[3].isString()) {
      continue;
    }
    if (e.path[1].toStringRef() == "state" && e.path[2].isString()) {
      const auto it = index.find(e.path[2].toStringRef());
      DATAPAR_CHECK(it != index.end(), "dcp: ", e.name, " names no parameter of the module");
      if (!per_param.contains(it->second)) per_param.insert(it->second, new_dict());
      per_param.at(it->second)
          .toGenericDict()
          .insert(e.path[3].toStringRef(), e.kind == State::Kind::kValue ? e.value : IValue(e.boxes.at(0).local));
    } else if (e.path[1].toStringRef() == "param_groups" && e.path[2].isInt()) {
      const int64_t g = e.path[2].toInt();
      if (groups.count(g) == 0) groups.emplace(g, new_dict());
      IValue value = e.value;
      if (e.path[3].toStringRef() == "params") {  // names -> PyTorch's numbers
        DATAPAR_CHECK(e.value.isList(), "dcp: ", e.name, " is not a list of parameter names");
        c10::impl::GenericList numbers(c10::AnyType::get());
        for (const IValue& name : e.value.toListRef()) {
          const auto it = name.isString() ? index.find(name.toStringRef()) : index.end();
          DATAPAR_CHECK(it != index.end(), "dcp: param group ", g, " names a parameter the module does not have");
          numbers.push_back(it->second);
        }
        value = numbers;
      }
      groups.at(g).insert(e.path[3].toStringRef(), value);
    }
  }
  c10::impl::GenericList param_groups(c10::AnyType::get());
  for (auto& g : groups) param_groups.push_back(g.second);
  OptimizerState osd = new_dict();
  osd.insert("state", per_param);
  osd.insert("param_groups", param_groups);
  return osd;
}

void apply_optimizer(const State& state, const std::string& prefix, optim::Optimizer& optimizer,
                     torch::nn::Module& module) {
  // The state's tensors become the optimizer's: those add_optimizer put in are its own already.
  datapar::detail::adopt_optimizer_state_dict(optimizer,
                                              optimizer_state_of(state, prefix, parameter_names(optimizer, module)));
}

}  // namespace datapar::dcp
