// See diloco.h.
#include "diloco.h"

#include <string>
#include <type_traits>

#include "datapar/error.h"
#include "optim/state_key.h"
#include "rank_state.h"

namespace datapar::tools {
namespace {

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

void save_diloco_state(const TrainPlan& plan, const DiLoCo& diloco, const torch::optim::SGD& sgd,
                       const std::vector<at::Tensor>& params, int64_t epoch) {
  StateDict state = diloco.state_dict();
  using StateMap = std::decay_t<decltype(sgd.state())>;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = sgd.state().find(key_of<StateMap>(params[i]));
    if (it == sgd.state().end()) continue;
    const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
    if (s.momentum_buffer().defined()) state.insert("inner.momentum." + std::to_string(i), s.momentum_buffer());
  }
  save_rank_state(plan, "diloco", epoch, state);
}

std::unique_ptr<DiLoCo> load_diloco_state(const TrainPlan& plan, std::unique_ptr<DiLoCo> diloco,
                                          torch::optim::SGD& sgd, const std::vector<at::Tensor>& params,
                                          const std::shared_ptr<ProcessGroup>& across, int64_t epoch) {
  load_rank_state(plan, "diloco", epoch, "DiLoCo", "the outer momentum and this rank's SGD momentum",
                  [&](const StateDict& state) {
                    auto resumed = std::make_unique<DiLoCo>(params, across, diloco_options(plan.options),
                                                            state);
                    using StateMap = std::decay_t<decltype(sgd.state())>;
                    for (size_t i = 0; i < params.size(); ++i) {
                      const at::Tensor* buffer = state.find("inner.momentum." + std::to_string(i));
                      if (buffer == nullptr) continue;
                      DATAPAR_CHECK(buffer->sizes() == params[i].sizes() &&
                                        buffer->scalar_type() == params[i].scalar_type(),
                                    "inner.momentum.", i, " does not fit the model's parameter ", i);
                      auto s = std::make_unique<torch::optim::SGDParamState>();
                      s->momentum_buffer(buffer->clone().to(params[i].device()));
                      sgd.state()[key_of<StateMap>(params[i])] = std::move(s);
                    }
                    diloco = std::move(resumed);
                  });
  return diloco;
}

}  // namespace datapar::tools
