// See param_state.h.
#include "optim/param_state.h"

#include "datapar/error.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <numeric>

namespace datapar::detail {
namespace {

namespace optim = torch::optim;

template <typename AdamState>
std::unique_ptr<optim::OptimizerParamState> adam_state(const ParamStateMeta& meta,
                                                       const std::vector<at::Tensor>& tensors) {
  auto s = std::make_unique<AdamState>();
  s->step(meta[1]);
  s->exp_avg(tensors.at(0));
  s->exp_avg_sq(tensors.at(1));
  if (meta[2]) s->max_exp_avg_sq(tensors.at(2));
  return s;
}

template <typename AdamState>
ParamStateMeta adam_meta(const optim::OptimizerParamState* state) {
  const auto* a = static_cast<const AdamState*>(state);
  return {1, a->step(), a->max_exp_avg_sq().defined() ? 1 : 0};
}

template <typename AdamState>
void add_adam_tensors(const optim::OptimizerParamState& state, std::vector<at::Tensor>& out) {
  const auto& a = static_cast<const AdamState&>(state);
  for (const at::Tensor& t : {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq()}) {
    if (t.defined()) out.push_back(t);
  }
}

}  // namespace

OptimizerKind optimizer_kind(const optim::Optimizer& o) {
  if (dynamic_cast<const optim::SGD*>(&o)) return OptimizerKind::kSgd;
  if (dynamic_cast<const optim::Adam*>(&o)) return OptimizerKind::kAdam;
  if (dynamic_cast<const optim::AdamW*>(&o)) return OptimizerKind::kAdamW;
  return OptimizerKind::kOther;
}

const char* optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kAdamW: return "AdamW";
    case OptimizerKind::kOther: break;
  }
  return "an optimizer other than SGD, Adam and AdamW";
}

std::unique_ptr<optim::Optimizer> make_optimizer(OptimizerKind kind, std::vector<at::Tensor> params,
                                                 const optim::OptimizerOptions& options) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<optim::SGD>(std::move(params), static_cast<const optim::SGDOptions&>(options));
    case OptimizerKind::kAdam:
      return std::make_unique<optim::Adam>(std::move(params), static_cast<const optim::AdamOptions&>(options));
    case OptimizerKind::kAdamW:
      return std::make_unique<optim::AdamW>(std::move(params), static_cast<const optim::AdamWOptions&>(options));
    case OptimizerKind::kOther: break;
  }
  throw InvalidArgumentError(str_cat("datapar makes copies of SGD, Adam and AdamW only, not of ",
                                     optimizer_kind_name(kind),
                                     ".\n---> HINT: pass an OptimizerFactory that makes yours instead."));
}

namespace {

bool amsgrad(OptimizerKind kind, const optim::OptimizerOptions& options) {
  if (kind == OptimizerKind::kAdam) return static_cast<const optim::AdamOptions&>(options).amsgrad();
  if (kind == OptimizerKind::kAdamW) return static_cast<const optim::AdamWOptions&>(options).amsgrad();
  return false;
}

template <typename AdamState>
std::unique_ptr<optim::OptimizerParamState> zero_adam_state(const at::Tensor& p, bool with_maximum) {
  auto s = std::make_unique<AdamState>();
  s->step(0);
  s->exp_avg(at::zeros_like(p, at::MemoryFormat::Contiguous));
  s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Contiguous));
  if (with_maximum) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Contiguous));
  return s;
}

}  // namespace

std::vector<std::string> param_state_names(OptimizerKind kind, const optim::OptimizerOptions& options) {
  switch (kind) {
    case OptimizerKind::kSgd:
      if (static_cast<const optim::SGDOptions&>(options).momentum() == 0) return {};
      return {"momentum_buffer"};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (amsgrad(kind, options)) return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return {"step", "exp_avg", "exp_avg_sq"};
    case OptimizerKind::kOther: break;
  }
  return {};
}

std::unique_ptr<optim::OptimizerParamState> zero_param_state(OptimizerKind kind, const at::Tensor& p,
                                                             const optim::OptimizerOptions& options) {
  switch (kind) {
    case OptimizerKind::kSgd: {
      if (static_cast<const optim::SGDOptions&>(options).momentum() == 0) return nullptr;
      auto s = std::make_unique<optim::SGDParamState>();
      s->momentum_buffer(at::zeros_like(p, at::MemoryFormat::Contiguous));
      return s;
    }
    case OptimizerKind::kAdam: return zero_adam_state<optim::AdamParamState>(p, amsgrad(kind, options));
    case OptimizerKind::kAdamW: return zero_adam_state<optim::AdamWParamState>(p, amsgrad(kind, options));
    case OptimizerKind::kOther: break;
  }
  return nullptr;
}

ParamStateMeta param_state_meta(OptimizerKind kind, const optim::OptimizerParamState* s) {
  if (s == nullptr) return {0, 0, 0};
  switch (kind) {
    case OptimizerKind::kSgd:
      return {static_cast<const optim::SGDParamState*>(s)->momentum_buffer().defined() ? 1 : 0, 0, 0};
    case OptimizerKind::kAdam: return adam_meta<optim::AdamParamState>(s);
    case OptimizerKind::kAdamW: return adam_meta<optim::AdamWParamState>(s);
    case OptimizerKind::kOther: break;
  }
  return {0, 0, 0};
}

std::vector<at::Tensor> param_state_tensors(OptimizerKind kind, const optim::OptimizerParamState& s) {
  std::vector<at::Tensor> out;
  if (kind == OptimizerKind::kSgd) {
    const at::Tensor& m = static_cast<const optim::SGDParamState&>(s).momentum_buffer();
    if (m.defined()) out.push_back(m);
  } else if (kind == OptimizerKind::kAdam) {
    add_adam_tensors<optim::AdamParamState>(s, out);
  } else if (kind == OptimizerKind::kAdamW) {
    add_adam_tensors<optim::AdamWParamState>(s, out);
  }
  return out;
}

size_t param_state_tensor_count(OptimizerKind kind, const ParamStateMeta& meta) {
  if (!meta[0]) return 0;
  return kind == OptimizerKind::kSgd ? 1 : 2 + (meta[2] ? 1 : 0);
}

std::unique_ptr<optim::OptimizerParamState> make_param_state(OptimizerKind kind, const ParamStateMeta& meta,
                                                             const std::vector<at::Tensor>& tensors) {
  if (kind == OptimizerKind::kSgd) {
    auto s = std::make_unique<optim::SGDParamState>();
    s->momentum_buffer(tensors.at(0));
    return s;
  }
  if (kind == OptimizerKind::kAdam) return adam_state<optim::AdamParamState>(meta, tensors);
  return adam_state<optim::AdamWParamState>(meta, tensors);
}

std::unique_ptr<optim::OptimizerParamState> copy_param_state(OptimizerKind kind,
                                                             const optim::OptimizerParamState& s) {
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& t : param_state_tensors(kind, s)) tensors.push_back(t.clone());
  return make_param_state(kind, param_state_meta(kind, &s), tensors);
}

void zero_gradients_in_place(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    at::Tensor& g = const_cast<at::Tensor&>(p).mutable_grad();
    if (!g.defined()) continue;
    g.detach_();
    g.zero_();
  }
}

std::vector<int> balanced_owners(const std::vector<at::Tensor>& params, int world) {
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<size_t>(r)] += params[i].numel();
  }
  return owner;
}

}  // namespace datapar::detail
