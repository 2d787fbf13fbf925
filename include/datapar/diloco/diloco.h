// Local SGD and DiLoCo (issue 48): data parallelism that talks every H steps instead of every
// step, for links too slow for DDP.
//
// Each rank trains its own copy of the model with its own (inner) optimizer on its share of
// the data, with no communication, for `sync_every` steps; then the ranks average their
// parameters. Local SGD (PyTorch's PeriodicModelAverager, outer "replace") takes the average
// as the new parameters. DiLoCo (Douillard et al., 2023) treats the difference between the
// parameters the round started from and the average as a gradient (the pseudo-gradient) and
// steps an outer optimizer with it: SGD with Nesterov momentum (the paper's lr 0.7, momentum
// 0.9). Every rank then starts the next round from the same parameters; each keeps its
// inner optimizer's state.
//
//   datapar::DiLoCoOptions options;
//   options.sync_every = 50;
//   datapar::DiLoCo diloco(model->parameters(), group, options);  // every rank from rank 0's
//   for (...) {
//     inner.zero_grad(); loss(model->forward(x), y).backward(); inner.step();
//     diloco.step();  // collective every 50th call
//   }
//
// Over hybrid sharding, each shard group is one replica: FSDP within the group (no
// replicate_group: the inner steps do not talk across groups) and DiLoCo over its shards
// across the groups' matching ranks:
//
//   const HybridGroups groups = hybrid_groups();
//   fully_shard_each<...>(*model, groups.shard);
//   FullyShardedDataParallel fsdp(model, groups.shard);
//   torch::optim::SGD inner(fsdp.parameters(), 0.1);
//   datapar::DiLoCo diloco(fsdp.parameters(), groups.replicate, options);
//
// H = 1 with "replace" is DDP's training (an average of the parameters after a step of SGD,
// with or without momentum, is the step on the averaged gradient), at a parameter's worth
// of all-reduce per step.
//
// Streaming DiLoCo (Douillard et al., 2025; torchft's DiLoCo with fragments): with
// `fragments` K > 1 the parameters (all of them, end to end, in K equal ranges) sync one
// fragment at a time, each every H steps, fragment k at steps H (k + 1) / K of each round:
// the bytes of any one step are 1/K of the model's. `outer_dtype` bf16 or int8 sends the
// pseudo-gradients in 2 or 1 bytes a value (Note [A quantised average] in
// diloco/outer_exchange.cc); float32 averages the parameters exactly.
//
// Under fault tolerance, ft::FaultTolerantDiLoCo (datapar/ft/fault_tolerant_diloco.h) runs
// the rounds with average_parameters() and outer_step(), sync()'s halves.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"
#include "datapar/state_dict.h"

namespace datapar {

struct DiLoCoOptions {
  int64_t sync_every = 50;            // H: inner steps per round
  std::string outer = "nesterov";     // "nesterov" (DiLoCo) or "replace" (local SGD)
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  int64_t fragments = 1;              // K: ranges of the parameters synced in turn (1..H)
  std::string outer_dtype = "float32";  // what the exchange sends: float32, bf16 or int8
};

class DiLoCo {
 public:
  // Over `params` (the model's, trained by the inner optimizer). Collective: every rank
  // starts from rank 0's values.
  DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group, DiLoCoOptions options = {});
  // Resumed from `state` (state_dict() of a run), the parameters this rank's own as they were
  // then (in the middle of a round, each rank's differ): nothing is broadcast.
  DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group, DiLoCoOptions options,
         const StateDict& state);
  ~DiLoCo();
  DiLoCo(const DiLoCo&) = delete;
  DiLoCo& operator=(const DiLoCo&) = delete;

  // After each inner step: syncs the fragments due at this step (with one fragment, the
  // sync_every-th step since the last round ends the round: sync()). Returns whether any
  // synced.
  bool step();
  // Collective: averages every parameter over the group and takes the outer step; every
  // rank's parameters become the round's result. Called early, it ends the round there for
  // every fragment (datapar train ends one with each epoch).
  void sync();

  // sync() in two halves, for a caller that must change nothing until every rank has the
  // round's result and may have to average again over other ranks (fault tolerance:
  // ft::FaultTolerantDiLoCo). REQUIRES: fragments == 1.
  //
  // Collective over `group` (any group of ranks with the same options, not necessarily the
  // one given at construction): the ranks' parameters averaged, each rank's weighted by
  // `weight` (1: it trained this round's inner steps; 0: it did not, e.g. it joined during
  // the round, and counts for nothing). Changes nothing. Throws InvalidArgumentError when the
  // weights sum to 0, and what the group's collectives throw (CommError, TimeoutError).
  struct Average {
    at::Tensor parameters;  // (numel,) every parameter end to end; the same on every rank
    double weights = 0;     // their sum: how many ranks' inner steps it holds
  };
  Average average_parameters(ProcessGroup& group, double weight) const;
  // Local: the outer step with `average` (from average_parameters): the parameters, the
  // outer parameters and the momentum become the round's result, and the round ends.
  void outer_step(const Average& average);

  // The parameters the round started from (the outer parameters); after a round, the
  // parameters' values.
  const std::vector<at::Tensor>& outer_parameters() const { return start_; }

  // Inner steps taken so far, since the round began, and rounds ended.
  int64_t inner_steps() const { return inner_steps_; }
  int64_t steps_since_sync() const { return since_sync_; }
  int64_t rounds() const { return rounds_; }

  // What a resumed run needs besides each rank's model and inner optimizer: the parameters
  // the round started from, the outer momentum, the counts (the same on every rank).
  StateDict state_dict() const;

 private:
  void check_options() const;
  void load_state_dict(const StateDict& state);
  // Averages elements [begin, end) of the parameters (all of them end to end) and takes the
  // outer step on them.
  void sync_range(int64_t begin, int64_t end);
  // Elements [begin, end) of `tensors` (shaped as the parameters) end to end: (end - begin,).
  at::Tensor flat(const std::vector<at::Tensor>& tensors, int64_t begin, int64_t end) const;
  // Elements [begin, end) of the parameters averaged over `group`; with a weight, each
  // rank's weighted by it (its `weights` the sum), else plainly (its `weights` the ranks).
  Average average_range(ProcessGroup& group, int64_t begin, int64_t end, std::optional<double> weight) const;
  // The outer step on elements [begin, end) with their average (average_range's).
  void step_range(int64_t begin, int64_t end, const at::Tensor& average);

  std::vector<at::Tensor> params_;
  std::shared_ptr<ProcessGroup> group_;
  DiLoCoOptions options_;
  std::vector<at::Tensor> start_;     // the parameters the round started from (the outer parameters)
  std::vector<at::Tensor> momentum_;  // the outer optimizer's
  int64_t numel_ = 0;  // of all the parameters
  int64_t inner_steps_ = 0, since_sync_ = 0, rounds_ = 0;
};

}  // namespace datapar
