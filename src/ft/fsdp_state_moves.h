// The moves of FaultTolerantFsdp's state that both ways of keeping its shards make
// (FsdpTwoCopies, FsdpReplicas): the optimizer state of one shard, the whole state a member
// that has not trained yet sends, the buffers of the member at the newest step.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>

#include "datapar/ft/fault_tolerant_fsdp.h"
#include "optim/param_state.h"

namespace datapar::ft::detail {

// The optimizer's state of `param` (null: none yet), and setting it.
const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& optimizer, const at::Tensor& param);
void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
               std::unique_ptr<torch::optim::OptimizerParamState> state);

// The kind of `optimizer`, which must be one whose state the members can move (SGD, Adam,
// AdamW): MembershipError's cousin, an Error saying so, otherwise.
datapar::detail::OptimizerKind movable_kind(const torch::optim::Optimizer& optimizer);

// Collective: member `root` (one that has not trained yet) sends the whole state (`model`,
// `optimizer`: its own, ignored elsewhere); every member loads it into `next`.
void load_whole_state(ProcessGroup& group, int root, const StateDict& model, const OptimizerState& optimizer,
                      const FsdpParts& next);

// Collective: the buffers (BatchNorm's statistics) of member `source` (which has `current`)
// into every member's `next`.
void take_buffers(ProcessGroup& group, int source, const FsdpParts* current, const FsdpParts& next);

}  // namespace datapar::ft::detail
