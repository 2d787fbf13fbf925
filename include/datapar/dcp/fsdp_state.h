// FullyShardedDataParallel's model and optimizer as entries of a dcp::State, sharded: each
// rank puts only what its flat shards hold (a parameter's rows and part rows: boxes of the
// parameter), in the names of the unsharded model (PyTorch's get_state_dict), so that
//   - no rank gathers a parameter to save or load it,
//   - the checkpoint loads at any world size, into FSDP (any units) or a whole model
//     (dcp::add_module), and into PyTorch's FSDP2 or DDP.
//
//   dcp::State state;
//   dcp::add_fsdp(state, "model", fsdp);
//   dcp::add_fsdp_optimizer(state, "optim", fsdp, adam);   // adam over fsdp.parameters()
//   dcp::save(state, dir, *group);      // or dcp::load(state, dir, *group), then:
//   dcp::apply_fsdp_optimizer(state, "optim", fsdp, adam);
//
// Loading writes into the shards and the optimizer's state tensors in place. Buffers are
// whole (the same on every rank), in the dtype they have (FsdpOptions::buffer_dtype's).
//
// Hybrid sharding (HSDP): every replica holds the same shards, so the checkpoint is written
// once, by the first replica's shard group: dcp::save(state, dir, groups) below. It loads as
// any other, into each shard group alike: dcp::load(state, dir, *groups.shard).
#pragma once

#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "datapar/dcp/checkpoint.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/fsdp/hybrid_groups.h"

namespace datapar::dcp {
namespace detail {

void add_fsdp_model(State& state, const std::string& prefix, const torch::nn::Module& module,
                    const std::vector<ShardRange>& ranges, const std::vector<at::Tensor>& shards);
void add_fsdp_optimizer(State& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                        const std::vector<ShardRange>& ranges, const std::vector<at::Tensor>& shards);
void apply_fsdp_optimizer(const State& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                          const std::vector<ShardRange>& ranges, const std::vector<at::Tensor>& shards);

}  // namespace detail

// "<prefix>.<name>" for each parameter (this rank's boxes) and buffer (whole).
template <typename M>
void add_fsdp(State& state, const std::string& prefix, const FullyShardedDataParallel<M>& fsdp) {
  detail::add_fsdp_model(state, prefix, *fsdp.module(), fsdp.shard_ranges(), fsdp.parameters());
}

// The optimizer over fsdp.parameters(): "<prefix>.state.<name>.<key>" (this rank's boxes of
// exp_avg, exp_avg_sq, momentum_buffer; step whole) and "<prefix>.param_groups.<i>.<key>",
// params naming the unsharded model's parameters. Creates missing state as zeros first.
template <typename M>
void add_fsdp_optimizer(State& state, const std::string& prefix, const FullyShardedDataParallel<M>& fsdp,
                        torch::optim::Optimizer& optimizer) {
  detail::add_fsdp_optimizer(state, prefix, optimizer, fsdp.shard_ranges(), fsdp.parameters());
}

// After load(): the step counts and hyperparameters back into the optimizer.
template <typename M>
void apply_fsdp_optimizer(const State& state, const std::string& prefix, const FullyShardedDataParallel<M>& fsdp,
                          torch::optim::Optimizer& optimizer) {
  detail::apply_fsdp_optimizer(state, prefix, optimizer, fsdp.shard_ranges(), fsdp.parameters());
}

// HSDP: saves `state` (this rank's shards) once, over the shard group of the first replica;
// the other replicas write nothing and wait for it. Collective over the job: returns on
// every rank once the checkpoint is complete; throws CheckpointError on every rank of a
// replica group whose first member failed to save (that member throws its own error).
void save(const State& state, const std::string& dir, const HybridGroups& groups);

}  // namespace datapar::dcp
