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
//
// Fault tolerance (ZeroOptions::copies = 2, datapar/ft/fault_tolerant_ddp.h): each shard is
// kept by two ranks, its owner r and the next, r + 1 mod n, so that the loss of one member
// loses no state. Both update it from the gradients DDP's all-reduce left whole on every
// rank: no extra communication, 2/n of the state per rank instead of 1/n; then each owner
// broadcasts its parameters as above. After a membership change, reshard() shards the state
// over the new group, moving each shard to its new keepers from a member that has it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "datapar/optim/optimizer_factory.h"
#include "datapar/process_group/process_group.h"

namespace datapar {

struct ZeroOptions {
  // Each owner's parameters become views of one flat buffer per dtype, in index order
  // (PyTorch's parameters_as_bucket_view, whose default is false): step()'s broadcasts then
  // send and receive them in place, with no flat copy made or read back on any rank.
  // Parameters keep their values, their Tensor objects and their place in modules and
  // optimizers; only their memory moves, once, at construction over a group (data_ptr()
  // changes; reshard() moves none). An owner's parameters of a dtype are left in their own
  // memory when one of them is not contiguous (channels_last) or they are on several
  // devices; their broadcast then copies.
  bool parameters_as_bucket_view = true;
  // How many ranks keep each shard of the state: 1 (ZeRO-1), or 2 (its owner and the next
  // rank; for fault tolerance, see above). With 2 the optimizer must be SGD, Adam or AdamW,
  // whose state can move between ranks.
  int copies = 1;
};

class ZeroRedundancyOptimizer {
 public:
  // Builds the optimizer of a set of parameters: the same kind and hyperparameters on every
  // rank, one parameter group.
  using Factory = OptimizerFactory;

  // `params`: the same parameters in the same order on every rank (e.g. ddp.parameters());
  // `group`: the default group if null. Throws InvalidArgumentError for no parameters.
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, Factory make, std::shared_ptr<ProcessGroup> group = nullptr,
                          ZeroOptions options = {});
  // Not sharded yet: keeps the state of every parameter until reshard() shards it over a
  // group (a member of a fault-tolerant job before it joins its first membership).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, Factory make, ZeroOptions options);
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  // Zeroes every parameter's gradient (all of them: DDP writes every gradient on every rank).
  void zero_grad();

  // Updates the parameters this rank keeps, then shares them: collective, every rank calls
  // it. The same as update() then share().
  void step();
  // The local half of step(): updates the parameters whose state this rank keeps, from
  // their gradients. No communication.
  void update();
  // The collective half: each owner broadcasts its parameters to every rank.
  void share();

  // Collective over `group`, which replaces the group this optimizer shards over: the owners
  // are chosen anew for its size, and each shard's state moves to its keepers that lack it,
  // every parameter's value to every rank, both from `source[i]`, a rank of `group` that has
  // parameter i's state (and value) as the others should have it. `has(rank, i)`: whether
  // rank `rank` has it so (alike on every rank). What this rank keeps changes only once every
  // move succeeded. `group` is used until the next reshard(): hand a group whose owner keeps
  // it alive that long. Throws CommError or TimeoutError when a rank fails meanwhile (call it
  // again over the next group), InvalidArgumentError for an optimizer other than SGD, Adam
  // and AdamW.
  void reshard(std::shared_ptr<ProcessGroup> group, const std::vector<int>& source,
               const std::function<bool(int rank, size_t index)>& has);

  // The rank that owns parameter `index` (its position in `params`); -1 before the first
  // reshard() of an optimizer made without a group.
  int owner(size_t index) const { return owner_.empty() ? -1 : owner_.at(index); }
  // Whether this rank keeps the state of parameter `index` now.
  bool keeps(size_t index) const { return keeps_.at(index); }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  ProcessGroup& process_group() const;
  // The `make` given at construction (what kind of optimizer, with which options).
  const Factory& factory() const { return make_; }
  int copies() const { return options_.copies; }

  // This rank's optimizer, over the parameters it keeps (e.g. to change its learning rate;
  // change it alike on every rank, and again after each reshard(): a rank that joined has
  // the hyperparameters of `make` or of load_full_state()). Null on a rank that keeps none
  // (more ranks than parameters).
  torch::optim::Optimizer* shard_optimizer() { return shard_.get(); }

  // Bytes of optimizer state this rank holds now (SGD, Adam, AdamW; 0 for other kinds).
  int64_t state_bytes() const;

  // Collective: gathers every rank's state into an optimizer over all parameters, built
  // with `make` and holding the current hyperparameters, returned on rank `to` (null on the
  // others). InvalidArgumentError for an optimizer other than SGD, Adam or AdamW.
  std::unique_ptr<torch::optim::Optimizer> consolidate(int to = 0);

  // Every rank: takes the state of the parameters it keeps, and the hyperparameters, from
  // `full`, an optimizer of the same kind over the same parameters (e.g. restored from a
  // checkpoint). No communication.
  void load_full_state(const torch::optim::Optimizer& full);

 private:
  // Checks the arguments and the optimizer `make_` builds; sets hyper_.
  void check_factory();
  // Whether rank `rank` of `size` keeps the state of parameter `index` under `owners`.
  bool keeper(const std::vector<int>& owners, size_t index, int rank, int size) const;
  const torch::optim::OptimizerParamState* kept_state(size_t index) const;
  // Rebuilds shard_ over the parameters kept, with `states` (by index) and `hyper`.
  void rebuild(std::map<size_t, std::unique_ptr<torch::optim::OptimizerParamState>> states,
               const torch::optim::OptimizerOptions& hyper);

  std::vector<at::Tensor> params_;
  Factory make_;
  ZeroOptions options_;
  std::shared_ptr<ProcessGroup> group_;         // null until the first reshard() without one
  std::vector<int> owner_;                      // param index -> rank
  std::vector<std::vector<at::Tensor>> owned_;  // rank -> its parameters, in index order
  std::vector<bool> keeps_;                     // param index -> this rank keeps its state
  std::unique_ptr<torch::optim::OptimizerOptions> hyper_;  // the hyperparameters, kept or not
  std::unique_ptr<torch::optim::Optimizer> shard_;
};

}  // namespace datapar
