// ft::ShardedOptimizer: ZeRO-1 for a fault-tolerant job (issue 31, docs/fault_tolerance.md):
// the optimizer state sharded over the members as ZeroRedundancyOptimizer shards it, each
// shard kept by two members (its owner, rank r, and the next, r + 1 mod n), so that the
// death of one member loses no state. Each member updates the parameters of both shards it
// keeps from the gradients DDP's all-reduce left whole on every rank, so keeping the second
// shard costs no communication, only its memory (2/n of the state instead of 1/n) and its
// share of the update; then each owner broadcasts its parameters, as ZeRO-1 does.
//
// ft::FaultTolerantDdp drives it (its constructor that takes a ShardedOptimizer): after a
// membership change, reshard() brings every member to the newest committed step: the states
// move from a member that kept them at that step to their new keepers, the parameters from
// the same members to everyone. Two neighbouring members lost at once lose a shard: the job
// then stops with a MembershipError that says so (resume it from its last checkpoint).
//
// Supports SGD, Adam and AdamW (the optimizers whose state datapar can move), one parameter
// group; every member builds it with the same `make` over the same parameters.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/ft/standing.h"
#include "datapar/process_group/process_group.h"

namespace datapar::ft {

class ShardedOptimizer {
 public:
  using Factory = ZeroRedundancyOptimizer::Factory;

  // Before its first reshard() a member keeps the state of every parameter (none yet, or
  // load_full_state()'s). InvalidArgumentError for no parameters, or an optimizer `make`
  // builds other than SGD, Adam and AdamW.
  ShardedOptimizer(std::vector<at::Tensor> params, Factory make);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Takes the state of every parameter, and the hyperparameters, from `full` (an optimizer
  // of the same kind over the same parameters, e.g. from a checkpoint). Before reshard().
  void load_full_state(const torch::optim::Optimizer& full);

  // Zeroes every parameter's gradient, in place.
  void zero_grad();
  // Updates the parameters whose state this member keeps, from their gradients.
  void update();
  // Collective, after update(): each owner broadcasts its parameters to every member.
  void share(ProcessGroup& group);

  struct Resharded {
    int64_t step = 0;  // the newest committed step: every member is at it now
    int source = 0;    // the first rank that was at it (e.g. to take buffers from)
  };
  // Collective, after joining a membership epoch whose group is `group`: exchanges the
  // members' standings, applies a voted update another member committed, shards the state
  // over the group (moving each shard that a new keeper lacks from a member at the newest
  // step) and sets every parameter to its value at the newest step. `mine` follows what
  // this member keeps: the update applied at once (a failure later must not apply it
  // again), the newest step at the end. Throws MembershipError when no member has the
  // state of some parameter at the newest step, CommError or TimeoutError when a member
  // fails meanwhile (join again with `mine`, and reshard again).
  Resharded reshard(ProcessGroup& group, Standing& mine);

  // Collective: the whole state in an optimizer over every parameter, built with `make` and
  // holding the current hyperparameters, on rank `to` (null on the others). After reshard().
  std::unique_ptr<torch::optim::Optimizer> consolidate(ProcessGroup& group, int to = 0);

  const std::vector<at::Tensor>& parameters() const { return params_; }
  // Whether this member keeps the state of parameter `index` now.
  bool keeps(size_t index) const { return keeps_.at(index); }
  // Parameter `index`'s owner in the current epoch's group (-1 before the first reshard()).
  int owner(size_t index) const { return owner_.empty() ? -1 : owner_.at(index); }
  // The optimizer over the parameters this member keeps (null when it keeps none), e.g. to
  // change the learning rate: change it alike on every member, and again after each
  // reshard() (a member that joined has the hyperparameters of `make` or of
  // load_full_state()).
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  // Bytes of optimizer state this member keeps.
  int64_t state_bytes() const;

 private:
  // Rebuilds optimizer_ over the parameters kept, with `states` (by index).
  void rebuild(std::map<size_t, std::unique_ptr<torch::optim::OptimizerParamState>> states);
  const torch::optim::OptimizerParamState* kept_state(size_t index) const;

  std::vector<at::Tensor> params_;
  Factory make_;
  int kind_;                       // detail::OptimizerKind
  std::vector<bool> keeps_;        // per parameter
  std::vector<int> owner_;         // per parameter, in the current group
  std::unique_ptr<torch::optim::OptimizerOptions> options_;  // the hyperparameters
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace datapar::ft
