// Moves optimizer states (and parameter values) between the ranks of a group, one source
// rank at a time: ZeroRedundancyOptimizer::consolidate() gathers every shard on one rank,
// ZeroRedundancyOptimizer::reshard() gives each new holder of a shard its state.
//
// Note [Moving optimizer state]
// Each source first broadcasts a little metadata (per moved parameter: whether it has state,
// Adam's step count, whether amsgrad's maximum exists), then the tensors themselves in one
// coalesced broadcast, received into scratch tensors shaped like the parameters.
// Broadcasts, not sends, so that every backend (nccl included) and every device moves them
// the same way; ranks that do not keep what they receive drop it, one source at a time, so
// no rank ever holds more than one source's share besides its own.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "optim/param_state.h"

namespace datapar::detail {

struct ParamStateMoves {
  std::vector<int> source;   // per parameter: the rank that sends it (-1: none)
  std::vector<bool> state;   // per parameter: its optimizer state moves
  std::vector<bool> value;   // per parameter: its value moves (into the parameter, on every rank)
  std::vector<bool> keep;    // per parameter: this rank keeps the state it receives
};

// Collective: every rank calls it with the same sources and flags (keep aside). `held(p)`:
// on a source, the state it holds for parameter p (null: none yet). Returns the states this
// rank kept, by parameter index.
std::map<size_t, std::unique_ptr<torch::optim::OptimizerParamState>> broadcast_param_states(
    ProcessGroup& group, OptimizerKind kind, const std::vector<at::Tensor>& params, const ParamStateMoves& moves,
    const std::function<const torch::optim::OptimizerParamState*(size_t)>& held);

}  // namespace datapar::detail
