// See diloco.h.
#include "diloco.h"

#include <string>
#include <type_traits>

#include "datapar/error.h"
#include "optim/param_state.h"
#include "optim/state_key.h"
#include "rank_state.h"

namespace datapar::tools {
namespace {

using datapar::detail::OptimizerKind;
using datapar::detail::ParamStateMeta;
using datapar::detail::make_param_state;
using datapar::detail::optimizer_kind;
using datapar::detail::optimizer_kind_name;
using datapar::detail::param_state_meta;
using datapar::detail::param_state_tensor_count;
using datapar::detail::param_state_tensors;

template <typename Map>
typename Map::key_type key_of(const at::Tensor& t) {
  return datapar::detail::optimizer_state_key<Map>(t);
}

}  // namespace

DiLoCoOptions diloco_options(const TrainOptions& o) {
  DiLoCoOptions d;
  d.sync_every = o.sync_every;
  d.outer = o.outer_optimizer;
  d.outer_lr = o.outer_lr;
  d.outer_momentum = o.outer_momentum;
  d.fragments = o.fragments;
  d.outer_dtype = o.outer_dtype;
  return d;
}

// The inner optimizer's state of parameter i: "inner.i.meta" (optimizer_state's meta: whether
// it has any, Adam's step, amsgrad's maximum) and "inner.i.K", its K-th tensor; "inner.kind"
// says whose (SGD, Adam or AdamW).
void save_diloco_state(const TrainPlan& plan, const DiLoCo& diloco, const torch::optim::Optimizer& optimizer,
                       const std::vector<at::Tensor>& params, int64_t epoch) {
  StateDict state = diloco.state_dict();
  const OptimizerKind kind = optimizer_kind(optimizer);
  state.insert("inner.kind", at::scalar_tensor(static_cast<int64_t>(kind), at::kLong));
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = optimizer.state().find(key_of<StateMap>(params[i]));
    if (it == optimizer.state().end()) continue;
    const std::string prefix = "inner." + std::to_string(i) + ".";
    const ParamStateMeta meta = param_state_meta(kind, it->second.get());
    state.insert(prefix + "meta", at::tensor(std::vector<int64_t>(meta.begin(), meta.end()), at::kLong));
    const std::vector<at::Tensor> tensors = param_state_tensors(kind, *it->second);
    for (size_t k = 0; k < tensors.size(); ++k) state.insert(prefix + std::to_string(k), tensors[k]);
  }
  save_rank_state(plan, "diloco", epoch, state);
}

std::unique_ptr<DiLoCo> load_diloco_state(const TrainPlan& plan, std::unique_ptr<DiLoCo> diloco,
                                          torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                                          const std::shared_ptr<ProcessGroup>& across, int64_t epoch) {
  const OptimizerKind kind = optimizer_kind(optimizer);
  load_rank_state(
      plan, "diloco", epoch, "DiLoCo", "the outer momentum and this rank's inner optimizer state",
      [&](const StateDict& state) {
        auto resumed = std::make_unique<DiLoCo>(params, across, diloco_options(plan.options), state);
        const at::Tensor* saved_kind = state.find("inner.kind");
        DATAPAR_CHECK(saved_kind != nullptr && saved_kind->numel() == 1 &&
                          saved_kind->item<int64_t>() == static_cast<int64_t>(kind),
                      "it holds no inner state of this run's ", optimizer_kind_name(kind),
                      " (resume with the --optimizer it was saved with)");
        using StateMap = std::decay_t<decltype(optimizer.state())>;
        for (size_t i = 0; i < params.size(); ++i) {
          const std::string prefix = "inner." + std::to_string(i) + ".";
          const at::Tensor* meta_tensor = state.find(prefix + "meta");
          if (meta_tensor == nullptr) continue;
          DATAPAR_CHECK(meta_tensor->scalar_type() == at::kLong && meta_tensor->numel() == 3, prefix,
                        "meta is not 3 integers");
          const at::Tensor m = meta_tensor->contiguous();
          const ParamStateMeta meta{m[0].item<int64_t>(), m[1].item<int64_t>(), m[2].item<int64_t>()};
          if (meta[0] == 0) continue;
          std::vector<at::Tensor> tensors;
          for (size_t k = 0; k < param_state_tensor_count(kind, meta); ++k) {
            const at::Tensor* t = state.find(prefix + std::to_string(k));
            DATAPAR_CHECK(t != nullptr, prefix, k, " is missing");
            DATAPAR_CHECK(t->sizes() == params[i].sizes() && t->scalar_type() == params[i].scalar_type(), prefix, k,
                          " does not fit the model's parameter ", i);
            tensors.push_back(t->clone().to(params[i].device()));
          }
          optimizer.state()[key_of<StateMap>(params[i])] = make_param_state(kind, meta, tensors);
        }
        diloco = std::move(resumed);
      });
  return diloco;
}

}  // namespace datapar::tools
