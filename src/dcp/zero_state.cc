// dcp::add_zero_optimizer / apply_zero_optimizer. See datapar/dcp/zero_state.h.
#include "datapar/dcp/zero_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/optim/optimizer_state.h"
#include "dcp/optimizer_layout.h"
#include "optim/param_state.h"

namespace datapar::dcp {
namespace {

using c10::IValue;
using datapar::detail::str_cat;
using Dict = c10::impl::GenericDict;
namespace optim = torch::optim;

// The state keys of each parameter, known alike on every rank from the kind and options (a
// rank that owns nothing has no state to look at): what PyTorch's optimizers hold.
std::vector<std::string> state_keys(const optim::Optimizer& prototype) {
  const auto kind = datapar::detail::optimizer_kind(prototype);
  DATAPAR_CHECK(kind != datapar::detail::OptimizerKind::kOther,
                "dcp::add_zero_optimizer: supports ZeroRedundancyOptimizer over SGD, Adam and AdamW, whose state "
                "PyTorch's optimizers name alike.");
  return datapar::detail::param_state_names(kind, prototype.param_groups().at(0).options());
}

// The numbers of a hyperparameter (a number, a flag, or a tuple of numbers), appended.
void numbers_of(const IValue& v, std::vector<double>* out) {
  if (v.isDouble()) out->push_back(v.toDouble());
  if (v.isInt()) out->push_back(static_cast<double>(v.toInt()));
  if (v.isBool()) out->push_back(v.toBool() ? 1 : 0);
  if (v.isTuple()) {
    for (const IValue& e : v.toTupleRef().elements()) numbers_of(e, out);
  }
  if (v.isList()) {
    for (const IValue& e : v.toListRef()) numbers_of(e, out);
  }
}

// `v` with its numbers taken from `numbers` at `*at`, in the order numbers_of wrote them.
IValue with_numbers(const IValue& v, const std::vector<double>& numbers, size_t* at) {
  if (v.isDouble()) return numbers.at((*at)++);
  if (v.isInt()) return static_cast<int64_t>(numbers.at((*at)++));
  if (v.isBool()) return numbers.at((*at)++) != 0;
  if (v.isTuple()) {
    std::vector<IValue> elements;
    for (const IValue& e : v.toTupleRef().elements()) elements.push_back(with_numbers(e, numbers, at));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (v.isList()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const IValue& e : v.toListRef()) list.push_back(with_numbers(e, numbers, at));
    return list;
  }
  return v;
}

// The hyperparameters of `root`, the owner of parameter 0, on every rank: a rank that owns
// nothing has only what the factory gave it, and a learning-rate schedule may have moved on.
// The keys and shapes are alike everywhere (one kind of optimizer); only numbers travel.
Dict hyperparameters_of(ProcessGroup& group, int root, const Dict& mine) {
  std::vector<double> numbers;
  for (const auto& kv : mine) {
    if (kv.key().toStringRef() != "params") numbers_of(kv.value(), &numbers);
  }
  at::Tensor t = metadata_tensor(group, numbers);
  group.broadcast(t, root)->wait();
  const std::vector<double> got = host_doubles(t);
  Dict out = mine.copy();
  size_t at = 0;
  for (const auto& kv : mine) {
    if (kv.key().toStringRef() != "params") out.insert_or_assign(kv.key(), with_numbers(kv.value(), got, &at));
  }
  return out;
}

// Zero's parameter index of each of this rank's shard optimizer's parameters.
// A shard kept twice (fault tolerance) is not the owner's layout this file reads and writes.
void check_one_copy(const ZeroRedundancyOptimizer& zero, const char* what) {
  DATAPAR_CHECK(zero.copies() == 1, what, ": the ZeroRedundancyOptimizer keeps each shard twice (ZeroOptions::copies "
                "2, fault tolerance); save and load its state whole (consolidate(), load_full_state()).");
}

std::vector<size_t> owned_indices(const ZeroRedundancyOptimizer& zero) {
  std::vector<size_t> out;
  for (size_t i = 0; i < zero.parameters().size(); ++i) {
    if (zero.owner(i) == zero.process_group().rank()) out.push_back(i);
  }
  return out;
}

}  // namespace

void add_zero_optimizer(State& state, const std::string& prefix, ZeroRedundancyOptimizer& zero,
                        const torch::nn::Module& module) {
  check_one_copy(zero, "dcp::add_zero_optimizer");
  const std::vector<at::Tensor>& params = zero.parameters();
  const std::vector<std::string> names = detail::names_in(module, params, "dcp: the ZeroRedundancyOptimizer");
  const std::unique_ptr<optim::Optimizer> prototype = zero.factory()({params.front()});
  const std::vector<std::string> keys = state_keys(*prototype);

  optim::Optimizer* shard = zero.shard_optimizer();
  std::map<size_t, Dict> owned;  // zero's index -> the state PyTorch's layout gives it
  Dict group_options = optimizer_state_dict(*prototype).at("param_groups").toListRef().at(0).toGenericDict();
  if (shard != nullptr) {
    detail::create_missing_state(*shard);
    const OptimizerState osd = optimizer_state_dict(*shard);
    const std::vector<size_t> mine = owned_indices(zero);
    for (const auto& item : osd.at("state").toGenericDict()) {
      owned.emplace(mine.at(static_cast<size_t>(item.key().toInt())), item.value().toGenericDict());
    }
    group_options = osd.at("param_groups").toListRef().at(0).toGenericDict();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    for (const std::string& key : keys) {
      const bool step = key == "step";
      const std::vector<int64_t> sizes = step ? std::vector<int64_t>{} : params[i].sizes().vec();
      std::vector<Shard> boxes;
      if (zero.owner(i) == zero.process_group().rank()) {
        const at::Tensor t = owned.at(i).at(key).toTensor().detach();
        DATAPAR_CHECK(t.sizes().vec() == sizes, "dcp::add_zero_optimizer: ", names[i], "'s ", key, " is ", t.sizes(),
                      ", not ", c10::IntArrayRef(sizes), ".");
        boxes.push_back(Shard{t, std::vector<int64_t>(sizes.size(), 0), sizes});
      }
      state.put(str_cat(prefix, ".state.", names[i], ".", key), std::move(boxes), sizes,
                step ? at::kFloat : params[i].scalar_type(),
                {IValue(prefix), IValue("state"), IValue(names[i]), IValue(key)});
    }
  }
  OptimizerState groups(c10::AnyType::get(), c10::AnyType::get());
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(hyperparameters_of(zero.process_group(), zero.owner(0), group_options));
  groups.insert("param_groups", list);
  const bool adamw = datapar::detail::optimizer_kind(*prototype) == datapar::detail::OptimizerKind::kAdamW;
  detail::add_param_groups(state, prefix, groups, adamw, [&](int64_t, const Dict&) {
    c10::impl::GenericList all(c10::AnyType::get());
    for (const std::string& name : names) all.push_back(name);
    return all;
  });
}

void apply_zero_optimizer(const State& state, const std::string& prefix, ZeroRedundancyOptimizer& zero,
                          const torch::nn::Module& module) {
  check_one_copy(zero, "dcp::apply_zero_optimizer");
  optim::Optimizer* shard = zero.shard_optimizer();
  if (shard == nullptr) return;  // owns nothing: nothing to take
  const std::vector<std::string> names =
      detail::names_in(module, zero.parameters(), "dcp: the ZeroRedundancyOptimizer");
  const std::vector<size_t> mine = owned_indices(zero);
  const OptimizerState current = optimizer_state_dict(*shard);
  Dict per_param(c10::AnyType::get(), c10::AnyType::get());
  for (const auto& item : current.at("state").toGenericDict()) {
    Dict s = item.value().toGenericDict().copy();
    if (s.contains("step")) {
      const std::string& name = names.at(mine.at(static_cast<size_t>(item.key().toInt())));
      s.insert_or_assign("step", state.tensor(str_cat(prefix, ".state.", name, ".step")));
    }
    per_param.insert(item.key(), s);
  }
  OptimizerState osd(c10::AnyType::get(), c10::AnyType::get());
  osd.insert("state", per_param);
  osd.insert("param_groups", detail::loaded_param_groups(state, prefix, current));
  load_optimizer_state_dict(*shard, osd);
}

}  // namespace datapar::dcp
