// ZeroRedundancyOptimizer's state (ZeRO-1) as entries of a dcp::State: each parameter's
// optimizer state is written by the rank that owns it, with nothing gathered, under the
// names PyTorch's get_state_dict gives a whole optimizer of a DDP model
// ("<prefix>.state.<param>.<key>", "<prefix>.param_groups.0.<key>"). So a checkpoint saved
// under ZeRO at N ranks loads under ZeRO at M (each owner reads the state of what it owns
// now), into a whole optimizer (dcp::add_optimizer), and into PyTorch's DDP + optimizer; and
// one saved by any of those loads under ZeRO.
//
//   DistributedDataParallel ddp(model);
//   ZeroRedundancyOptimizer zero(ddp.parameters(), make_adam);
//   dcp::State state;
//   dcp::add_module(state, "model", *model);
//   dcp::add_zero_optimizer(state, "optim", zero, *model);  // collective
//   dcp::save(state, dir, *group);     // or dcp::load(state, dir, *group), then:
//   dcp::apply_zero_optimizer(state, "optim", zero, *model);
//
// SGD, Adam and AdamW, as ZeroRedundancyOptimizer::consolidate().
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "datapar/dcp/checkpoint.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"

namespace datapar::dcp {

// "<prefix>.state.<name>.<key>" for every parameter of `zero` (named as in `module`, whose
// parameters they are): this rank's box (the whole tensor; Adam's step a 0-d one) where it
// owns the parameter, no box where it does not; and the hyperparameters, those of a rank
// that owns parameters (a rank owning none has none of its own to give). Creates missing
// state as zeros first, so that load() has somewhere to put it. Collective over zero's
// group: every rank calls it.
void add_zero_optimizer(State& state, const std::string& prefix, ZeroRedundancyOptimizer& zero,
                        const torch::nn::Module& module);

// After load(): the step counts and hyperparameters back into this rank's shard optimizer
// (the state tensors were filled in place). No communication.
void apply_zero_optimizer(const State& state, const std::string& prefix, ZeroRedundancyOptimizer& zero,
                          const torch::nn::Module& module);

}  // namespace datapar::dcp
