// The optimizer state of FullyShardedDataParallel's shards, converted to and from the
// layout the unsharded model's optimizer would have (optim/optimizer_state.h): each state
// tensor of a shard (SGD's momentum, Adam's moments) gathered and cut into the model's
// parameters, numbered as in module.parameters(), as PyTorch's FSDP full optimizer state
// dict does; scalars (Adam's step) given to each.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "datapar/optim/optimizer_state.h"

namespace datapar::detail {

class FsdpUnit;

// Collective. REQUIRES: `optimizer` has one parameter group, of the units' shards.
OptimizerState full_optimizer_state(const torch::nn::Module& module,
                                           const std::vector<std::shared_ptr<FsdpUnit>>& units,
                                           const torch::optim::Optimizer& optimizer);

// Each rank takes its part; no communication. Throws InvalidArgumentError for a state that
// does not fit (the optimizer is unchanged then).
void load_full_optimizer_state(const torch::nn::Module& module, const std::vector<std::shared_ptr<FsdpUnit>>& units,
                               torch::optim::Optimizer& optimizer, const OptimizerState& state);

}  // namespace datapar::detail
