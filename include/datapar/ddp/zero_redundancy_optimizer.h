// ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded over the ranks
// (PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer).
//
//   DistributedDataParallel ddp(model);
//   ZeroRedundancyOptimizer zero(ddp.parameters(), [](std::vector<at::Tensor> shard) {
//     return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
//   });
//   ... loss.backward(); zero.step();
//
// Every parameter has one owner rank. Each rank builds the optimizer (with `make`) over the
// parameters it owns only, so Adam's two moment buffers, or SGD's momentum, exist once in the
// job instead of once per rank: about 1/world of the state per rank. step() updates the
// owned parameters from their (DDP-averaged) gradients, then every rank broadcasts its
// updated parameters to the others, one coalesced broadcast per owner, all in flight at
// once, into the parameters' own memory (ZeroOptions::parameters_as_bucket_view). The
// result equals unsharded training: the same update of the same gradient, made
// by one rank instead of all.
//
// Owners are chosen alike on every rank: parameters by size, largest first, each to the
// rank that owns the fewest elements so far (ties: the lowest rank).
//
// Checkpoints: consolidate() gathers the whole state into an ordinary optimizer (the kind
// `make` builds, over every parameter) on one rank, which make_checkpoint() saves in
// PyTorch's layout; load_full_state() takes the shard of a whole optimizer's state back, so
// a checkpoint resumes the same with or without sharding. consolidate() and
// load_full_state() support SGD, Adam and AdamW (step() supports any optimizer). Sharded
// checkpoints in PyTorch's DCP format, each owner writing its own state with nothing
// gathered: datapar/dcp/zero_state.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar {

struct ZeroOptions {
  // Each owner's parameters become views of one flat buffer per dtype, in index order
  // (PyTorch's parameters_as_bucket_view, whose default is false): step()'s broadcasts then
  // send and receive them in place, with no flat copy made or read back on any rank.
  // Parameters keep their values, their Tensor objects and their place in modules and
  // optimizers; only their memory moves, once, here (data_ptr() changes). An owner's
  // parameters of a dtype are left in their own memory when one of them is not contiguous
  // (channels_last) or they are on several devices; their broadcast then copies.
  bool parameters_as_bucket_view = true;
};

class ZeroRedundancyOptimizer {
 public:
  // Builds the optimizer of a set of parameters: the same kind and hyperparameters on every
  // rank, one parameter group.
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

  // `params`: the same parameters in the same order on every rank (e.g. ddp.parameters());
  // `group`: the default group if null. Throws InvalidArgumentError for no parameters.
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, Factory make, std::shared_ptr<ProcessGroup> group = nullptr,
                          ZeroOptions options = {});
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Zeroes every parameter's gradient (all of them: DDP writes every gradient on every rank).
  void zero_grad();

  // Updates the parameters this rank owns, then shares them: collective, every rank calls it.
  void step();

  // The rank that owns parameter `index` (its position in `params`).
  int owner(size_t index) const { return owner_.at(index); }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  ProcessGroup& process_group() const { return *group_; }
  // The `make` given at construction (what kind of optimizer, with which options).
  const Factory& factory() const { return make_; }

  // This rank's optimizer, over the parameters it owns (e.g. to change its learning rate;
  // change it alike on every rank). Null on a rank that owns none (more ranks than
  // parameters).
  torch::optim::Optimizer* shard_optimizer() { return shard_.get(); }

  // Bytes of optimizer state this rank holds now (SGD, Adam, AdamW; 0 for other kinds).
  int64_t state_bytes() const;

  // Collective: gathers every rank's state into an optimizer over all parameters, built
  // with `make` and holding the current hyperparameters, returned on rank `to` (null on the
  // others). InvalidArgumentError for an optimizer other than SGD, Adam or AdamW.
  std::unique_ptr<torch::optim::Optimizer> consolidate(int to = 0);

  // Every rank: takes the state of the parameters it owns, and the hyperparameters, from
  // `full`, an optimizer of the same kind over the same parameters (e.g. restored from a
  // checkpoint). No communication.
  void load_full_state(const torch::optim::Optimizer& full);

 private:
  std::vector<at::Tensor> params_;
  Factory make_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<int> owner_;                      // param index -> rank
  std::vector<std::vector<at::Tensor>> owned_;  // rank -> its parameters, in index order
  std::unique_ptr<torch::optim::Optimizer> shard_;
};

}  // namespace datapar
