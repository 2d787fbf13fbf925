// optimizer_state_dict / load_optimizer_state_dict. See optimizer_state.h.
#include "datapar/optim/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "optim/adopt_state.h"
#include "optim/param_state.h"
#include "optim/state_key.h"
#include "serialization/torch_file.h"

namespace datapar {
namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;
using detail::python_type_name;
using detail::str_cat;
namespace optim = torch::optim;

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

using Kind = datapar::detail::OptimizerKind;  // the one table of kinds (optim/param_state.h)

Kind kind_of(const optim::Optimizer& optimizer) {
  const Kind kind = datapar::detail::optimizer_kind(optimizer);
  if (kind == Kind::kOther) {
    throw InvalidArgumentError("optimizer state: this optimizer type is not supported; datapar saves and loads "
                               "torch::optim::SGD, Adam and AdamW.");
  }
  return kind;
}

template <typename Options>
void put_adam_options(const Options& o, Dict& g) {
  g.insert("lr", o.lr());
  g.insert("betas", c10::ivalue::Tuple::create(std::vector<IValue>{std::get<0>(o.betas()), std::get<1>(o.betas())}));
  g.insert("eps", o.eps());
  g.insert("weight_decay", o.weight_decay());
  g.insert("amsgrad", o.amsgrad());
  g.insert("maximize", false);
}

template <typename ParamState>
Dict adam_state(const ParamState& s) {
  Dict d = new_dict();
  // Python keeps the step as a float32 scalar tensor (PyTorch >= 1.12).
  d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
  d.insert("exp_avg", s.exp_avg());
  d.insert("exp_avg_sq", s.exp_avg_sq());
  if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq());
  return d;
}

// ---- reading, with checks that name what is wrong ----

const IValue& entry(const Dict& d, const char* key, const std::string& where) {
  auto it = d.find(key);
  DATAPAR_CHECK(it != d.end(), "optimizer state: ", where, " has no \"", key, "\"");
  return it->value();
}

bool has(const Dict& d, const char* key) { return d.find(key) != d.end(); }

double number(const Dict& d, const char* key, const std::string& where) {
  const IValue& v = entry(d, key, where);
  DATAPAR_CHECK(v.isDouble() || v.isInt(), "optimizer state: ", where, " \"", key, "\" is a ", python_type_name(v), ", not a number");
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

bool flag(const Dict& d, const char* key, const std::string& where) {
  const IValue& v = entry(d, key, where);
  DATAPAR_CHECK(v.isBool(), "optimizer state: ", where, " \"", key, "\" is a ", python_type_name(v), ", not a bool");
  return v.toBool();
}

// A state tensor, checked against its parameter and moved onto its device (and dtype).
// `copy` false: the tensor itself where it is on the parameter's device (adopt_optimizer_state_dict).
at::Tensor state_tensor(const Dict& d, const char* key, const at::Tensor& param, const std::string& where,
                        bool copy) {
  const IValue& v = entry(d, key, where);
  DATAPAR_CHECK(v.isTensor(), "optimizer state: ", where, " \"", key, "\" is a ", python_type_name(v), ", not a tensor");
  const at::Tensor& t = v.toTensor();
  DATAPAR_CHECK(t.sizes() == param.sizes(), "optimizer state: ", where, " \"", key, "\" has shape ", t.sizes(),
                " but the parameter has ", param.sizes(), ". Load the optimizer state of the same model.");
  // Another dtype is refused, not cast (issue 27): int64 failed at the first step with a
  // backtrace, and float64 into a float32 model was taken silently; the model's own entries
  // are held to their dtype the same way.
  DATAPAR_CHECK(t.scalar_type() == param.scalar_type(), "optimizer state: ", where, " \"", key, "\" is ",
                t.scalar_type(), " but the parameter is ", param.scalar_type(),
                ". Load the optimizer state saved with this model, in its dtype.");
  return t.to(param.device(), t.scalar_type(), /*non_blocking=*/false, copy);
}

int64_t step_count(const Dict& d, const std::string& where) {
  const IValue& v = entry(d, "step", where);
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return static_cast<int64_t>(v.toDouble());
  DATAPAR_CHECK(v.isTensor() && v.toTensor().numel() == 1, "optimizer state: ", where, " \"step\" is a ", python_type_name(v),
                ", not a number");
  return static_cast<int64_t>(v.toTensor().item<double>());
}

template <typename Options>
void read_adam_options(const Dict& g, Options& o, const std::string& where) {
  o.lr(number(g, "lr", where));
  const IValue& betas = entry(g, "betas", where);
  std::vector<IValue> b;
  if (betas.isTuple()) b = betas.toTupleRef().elements().vec();
  if (betas.isList()) b = betas.toListRef().vec();
  DATAPAR_CHECK(b.size() == 2 && (b[0].isDouble() || b[0].isInt()) && (b[1].isDouble() || b[1].isInt()), "optimizer state: ",
                where, " \"betas\" is not a pair of numbers");
  auto num = [](const IValue& v) { return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt()); };
  o.betas(std::make_tuple(num(b[0]), num(b[1])));
  o.eps(number(g, "eps", where));
  o.weight_decay(number(g, "weight_decay", where));
  o.amsgrad(has(g, "amsgrad") && flag(g, "amsgrad", where));
}

template <typename ParamState>
std::unique_ptr<optim::OptimizerParamState> read_adam_state(const Dict& s, const at::Tensor& p, const std::string& where,
                                                            bool copy) {
  auto out = std::make_unique<ParamState>();
  out->step(step_count(s, where));
  out->exp_avg(state_tensor(s, "exp_avg", p, where, copy));
  out->exp_avg_sq(state_tensor(s, "exp_avg_sq", p, where, copy));
  if (has(s, "max_exp_avg_sq") && !entry(s, "max_exp_avg_sq", where).isNone()) {
    out->max_exp_avg_sq(state_tensor(s, "max_exp_avg_sq", p, where, copy));
  }
  return out;
}

}  // namespace

OptimizerState optimizer_state_dict(const optim::Optimizer& optimizer) {
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  const Kind kind = kind_of(optimizer);
  Dict state = new_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    Dict g = new_dict();
    if (kind == Kind::kSgd) {
      const auto& o = static_cast<const optim::SGDOptions&>(group.options());
      g.insert("lr", o.lr());
      g.insert("momentum", o.momentum());
      g.insert("dampening", o.dampening());
      g.insert("weight_decay", o.weight_decay());
      g.insert("nesterov", o.nesterov());
      g.insert("maximize", false);
    } else if (kind == Kind::kAdam) {
      put_adam_options(static_cast<const optim::AdamOptions&>(group.options()), g);
    } else {
      put_adam_options(static_cast<const optim::AdamWOptions&>(group.options()), g);
    }
    c10::impl::GenericList params(c10::AnyType::get());
    for (const at::Tensor& p : group.params()) {
      params.push_back(index);
      auto it = optimizer.state().find(detail::optimizer_state_key<StateMap>(p));
      if (it != optimizer.state().end()) {
        Dict s = new_dict();
        if (kind == Kind::kSgd) {
          const auto& buf = static_cast<const optim::SGDParamState&>(*it->second).momentum_buffer();
          if (buf.defined()) s.insert("momentum_buffer", buf);
        } else if (kind == Kind::kAdam) {
          s = adam_state(static_cast<const optim::AdamParamState&>(*it->second));
        } else {
          s = adam_state(static_cast<const optim::AdamWParamState&>(*it->second));
        }
        if (!s.empty()) state.insert(index, s);
      }
      ++index;
    }
    g.insert("params", params);
    groups.push_back(g);
  }
  OptimizerState out = new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

namespace {

void load_state(optim::Optimizer& optimizer, const OptimizerState& state, bool copy) {
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  const Kind kind = kind_of(optimizer);
  const IValue& saved_state = entry(state, "state", "the optimizer state");
  const IValue& saved_groups = entry(state, "param_groups", "the optimizer state");
  DATAPAR_CHECK(saved_state.isGenericDict(), "optimizer state: \"state\" is a ", python_type_name(saved_state), ", not a dict");
  DATAPAR_CHECK(saved_groups.isList(), "optimizer state: \"param_groups\" is a ", python_type_name(saved_groups), ", not a list");
  auto& groups = optimizer.param_groups();
  const auto saved = saved_groups.toListRef();
  DATAPAR_CHECK(saved.size() == groups.size(), "optimizer state: it has ", saved.size(), " parameter groups but the optimizer has ",
                groups.size(), ". Build the optimizer with the same groups as the one saved.");

  // Phase 1: build everything, so that a mismatch leaves the optimizer unchanged.
  std::vector<std::unique_ptr<optim::OptimizerOptions>> options;
  std::vector<at::Tensor> by_index;  // saved parameter index -> this optimizer's parameter
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string where = str_cat("parameter group ", i);
    DATAPAR_CHECK(saved[i].isGenericDict(), "optimizer state: ", where, " is a ", python_type_name(saved[i]), ", not a dict");
    const Dict g = saved[i].toGenericDict();
    const IValue& params = entry(g, "params", where);
    DATAPAR_CHECK(params.isList() && params.toListRef().size() == groups[i].params().size(), "optimizer state: ", where, " has ",
                  params.isList() ? params.toListRef().size() : 0, " parameters but the optimizer's has ", groups[i].params().size(),
                  ". Build the optimizer over the same parameters as the one saved.");
    for (size_t j = 0; j < groups[i].params().size(); ++j) {
      const IValue& id = params.toListRef()[j];
      DATAPAR_CHECK(id.isInt() && id.toInt() >= 0, "optimizer state: ", where, " lists a parameter id that is not an int >= 0");
      if (by_index.size() <= static_cast<size_t>(id.toInt())) by_index.resize(id.toInt() + 1);
      by_index[id.toInt()] = groups[i].params()[j];
    }
    DATAPAR_CHECK(!has(g, "maximize") || !flag(g, "maximize", where), "optimizer state: ", where,
                  " has maximize=True, which libtorch's optimizers do not support.");
    std::unique_ptr<optim::OptimizerOptions> o = groups[i].options().clone();
    if (kind == Kind::kSgd) {
      auto& sgd = static_cast<optim::SGDOptions&>(*o);
      sgd.lr(number(g, "lr", where)).momentum(number(g, "momentum", where)).weight_decay(number(g, "weight_decay", where));
      sgd.dampening(has(g, "dampening") ? number(g, "dampening", where) : 0.0);
      sgd.nesterov(has(g, "nesterov") && flag(g, "nesterov", where));
    } else if (kind == Kind::kAdam) {
      read_adam_options(g, static_cast<optim::AdamOptions&>(*o), where);
    } else {
      read_adam_options(g, static_cast<optim::AdamWOptions&>(*o), where);
    }
    options.push_back(std::move(o));
  }
  std::vector<std::pair<at::Tensor, std::unique_ptr<optim::OptimizerParamState>>> param_states;
  for (const auto& item : saved_state.toGenericDict()) {
    const IValue& id = item.key();
    DATAPAR_CHECK(id.isInt() && id.toInt() >= 0 && static_cast<size_t>(id.toInt()) < by_index.size() &&
                      by_index[id.toInt()].defined(),
                  "optimizer state: \"state\" has an entry for parameter ", id, ", which no parameter group lists");
    const at::Tensor& p = by_index[id.toInt()];
    const std::string where = str_cat("the state of parameter ", id.toInt());
    DATAPAR_CHECK(item.value().isGenericDict(), "optimizer state: ", where, " is a ", python_type_name(item.value()), ", not a dict");
    const Dict s = item.value().toGenericDict();
    std::unique_ptr<optim::OptimizerParamState> ps;
    if (kind == Kind::kSgd) {
      // libtorch's SGD creates the buffer when a parameter has no state, and assumes it
      // exists when it has: so no buffer (Python's None) means no state.
      if (!has(s, "momentum_buffer") || entry(s, "momentum_buffer", where).isNone()) continue;
      auto sgd = std::make_unique<optim::SGDParamState>();
      sgd->momentum_buffer(state_tensor(s, "momentum_buffer", p, where, copy));
      ps = std::move(sgd);
    } else if (kind == Kind::kAdam) {
      ps = read_adam_state<optim::AdamParamState>(s, p, where, copy);
    } else {
      ps = read_adam_state<optim::AdamWParamState>(s, p, where, copy);
    }
    param_states.emplace_back(p, std::move(ps));
  }

  // Phase 2: commit.
  for (size_t i = 0; i < groups.size(); ++i) groups[i].set_options(std::move(options[i]));
  optimizer.state().clear();
  for (auto& [p, ps] : param_states) optimizer.state()[detail::optimizer_state_key<StateMap>(p)] = std::move(ps);
}

}  // namespace

void load_optimizer_state_dict(optim::Optimizer& optimizer, const OptimizerState& state) {
  load_state(optimizer, state, /*copy=*/true);
}

namespace detail {

void adopt_optimizer_state_dict(optim::Optimizer& optimizer, const OptimizerState& state) {
  load_state(optimizer, state, /*copy=*/false);
}

}  // namespace detail
}  // namespace datapar
