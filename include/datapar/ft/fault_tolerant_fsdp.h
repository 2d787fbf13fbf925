// FaultTolerantFsdp: fully sharded data parallel training (FSDP) that goes on when a member
// dies, hangs or joins (issue 31, docs/fault_tolerance.md), with the step protocol of
// FaultTolerantDdp. FSDP keeps 1/n of the parameters, gradients and optimizer state on each
// rank, so a death would lose a shard of the model itself: here each rank also keeps the
// shard of the rank before it (its parameters and optimizer state) and updates both on a
// commit. One failure at a time loses nothing: after a membership change every member
// takes the newest state from the members that kept each shard and the model is sharded
// anew over the new membership. Two neighbours lost at once lose a shard: the job stops
// with a MembershipError that says so (resume it from the last checkpoint).
//
// As FaultTolerantDdp, each global batch is cut into a fixed number of slices and the
// training has the same bits whoever is alive (Note [Gradients that do not depend on who is
// alive] in src/ft/slice_gradients.cc): each slice is a forward and backward of its own
// under no_sync (the unit's gradient kept whole), every member's slice of a pass is
// all-gathered unit by unit, and each member keeps its shard and the previous rank's of
// each, summed in slice order (ShardedSliceGradients). Every member runs as many passes as
// the member with the most slices, the collectives of FSDP's forward in step: one with
// fewer trains its first slice again as a shadow (Slice::shadow), its gradient dropped, in
// the time it would have waited.
//
//   ft::FaultTolerantFsdp<Net> trainer(
//       [] { return std::make_shared<Net>(); },                                  // the model, unsharded
//       [](Net& net, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options) {
//         fully_shard_each<torch::nn::LinearImpl>(net, group, options);          // its units
//       },
//       [](std::vector<at::Tensor> shards) {
//         return std::make_unique<torch::optim::SGD>(shards, torch::optim::SGDOptions(0.1).momentum(0.9));
//       },
//       elastic, /*slices=*/job_size);
//   while (trainer.step() < steps) {
//     trainer.train_step([&](FullyShardedDataParallel<Net>& fsdp, const ft::Slice& slice) {
//       const at::Tensor rows = rows_of(trainer.step(), slice);   // slice.index of slice.count
//       torch::mse_loss(fsdp.forward(x.index_select(0, rows)), y.index_select(0, rows)).backward();
//       return rows.numel();                                       // (count none of a shadow)
//     });
//   }
//   trainer.finish();
//
// Hybrid sharding (HSDP): over an ElasticGroup whose members come in replica groups
// (FtOptions::replica_group_size k > 1, each member its ReplicaSlot), each replica group
// shards the model over its k members and the groups are the copies: fault tolerance between
// replica groups, as torchft's. A group that loses a member leaves the job whole (the
// decider takes whole groups only); the others train on without stopping, keeping nothing
// but their own shards (FsdpReplicas); when the slot is filled again the group comes back and
// its members take their shards from the first group at the newest step, rank to matching
// rank, unit by unit (Note [Shards from the matching rank] in src/ft/fsdp_replicas.cc). The
// slices' gradients go whole within a group and by pieces across groups.
//
// Each membership epoch makes its own model (make_model), units (make_units, over the
// epoch's group, or under HSDP this member's replica group) and FSDP root, and an optimizer
// over its shards (SGD, Adam or AdamW, one group): fsdp() and optimizer() are the current
// epoch's (use them inside train, before and last). Memory: 2/n of the parameters and
// optimizer state per rank between steps (1/k under HSDP); while the members regroup, at
// most one unit whole besides (Note [Re-sharding unit by unit]); during a step the whole
// model's gradient of one slice (as no_sync keeps it) and, one unit at a time, every
// member's gradient of that unit (under HSDP, its replica group's, and every member's piece
// of its index).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/ft/module_sync.h"
#include "datapar/ft/slice_gradients.h"
#include "datapar/ft/step_protocol.h"
#include "datapar/optim/optimizer_factory.h"
#include "datapar/optim/optimizer_state.h"
#include "datapar/state_dict.h"

namespace datapar::ft {
namespace detail {

// One membership epoch's FSDP, as FsdpTwoCopies sees it.
struct FsdpParts {
  std::vector<at::Tensor> shards;  // fsdp.parameters(): one flat shard per unit
  std::vector<int64_t> unit_numels;  // each unit's parameters' elements (unpadded)
  std::vector<ShardRange> ranges;    // fsdp.shard_ranges()
  torch::optim::Optimizer* optimizer = nullptr;  // over `shards`
  torch::nn::Module* module = nullptr;           // for the buffers
  std::function<void(const StateDict&)> load_model;
  std::function<void(torch::optim::Optimizer&, const OptimizerState&)> load_optimizer;
};

// How FaultTolerantFsdp keeps its shards so that a member lost loses none, and how they move
// at a membership change. FsdpTwoCopies or FsdpReplicas: the non-template part of
// FaultTolerantFsdp.
class FsdpShardKeeper {
 public:
  virtual ~FsdpShardKeeper() = default;
  // Collective, after joining epoch `epoch` whose group is `group`: brings `next` (this
  // epoch's FSDP, made over its shard group) to the newest step. `current`: the epoch
  // before's (null before the first). `mine` follows what this member keeps, as
  // reshard_zero()'s, and a voted update it missed applied by apply_missed_vote() (current's
  // optimizer step and update()). Returns the newest step. MembershipError when no member
  // keeps some shard at the newest step.
  virtual int64_t rebuild(ProcessGroup& group, int64_t epoch, Standing& mine, const FsdpParts* current,
                          const FsdpParts& next, const std::function<void()>& apply_missed_vote) = 0;
  // The kept shards' gradients side by side (as many elements as this rank's shards);
  // undefined when none is kept.
  virtual const at::Tensor& kept_gradients() const = 0;
  // The committed step's update of the kept shards.
  virtual void update() = 0;
  // Bytes of the shards kept here besides this member's own: parameters, gradients, state.
  virtual int64_t kept_bytes() const = 0;
};

// Each shard kept by two members, its owner and the next rank (as ZeroOptions::copies = 2
// keeps ZeRO's): the previous rank's shard this member keeps besides its own; at a
// membership change the model is sharded anew over the new group, unit by unit.
class FsdpTwoCopies final : public FsdpShardKeeper {
 public:
  // Keeps the whole state to start from (a full state dict and a full optimizer state, as
  // FullyShardedDataParallel::load_full_* take them).
  FsdpTwoCopies(OptimizerFactory make_optimizer, StateDict model, OptimizerState optimizer);
  ~FsdpTwoCopies() override;
  FsdpTwoCopies(const FsdpTwoCopies&) = delete;
  FsdpTwoCopies& operator=(const FsdpTwoCopies&) = delete;

  int64_t rebuild(ProcessGroup& group, int64_t epoch, Standing& mine, const FsdpParts* current,
                  const FsdpParts& next, const std::function<void()>& apply_missed_vote) override;
  const at::Tensor& kept_gradients() const override;
  void update() override;
  int64_t kept_bytes() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// HSDP (FtOptions::replica_group_size): the members come in replica groups of `shard_size`
// consecutive ranks, each sharding the model over itself; the replicas are the copies. A
// member keeps only its own shard. At a membership change the layout stays (whole groups
// come and go): a member behind the newest step takes its shards, unit by unit, from the
// first member at the newest step with the same index in its group, shard to shard.
class FsdpReplicas final : public FsdpShardKeeper {
 public:
  FsdpReplicas(int shard_size, StateDict model, OptimizerState optimizer);
  ~FsdpReplicas() override;
  FsdpReplicas(const FsdpReplicas&) = delete;
  FsdpReplicas& operator=(const FsdpReplicas&) = delete;

  int64_t rebuild(ProcessGroup& group, int64_t epoch, Standing& mine, const FsdpParts* current,
                  const FsdpParts& next, const std::function<void()>& apply_missed_vote) override;
  const at::Tensor& kept_gradients() const override;
  void update() override {}
  int64_t kept_bytes() const override { return 0; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The units of `parts`'s FSDP, as ShardedSliceGradients takes them.
std::vector<ShardedSliceGradients::Unit> slice_units(const FsdpParts& parts);

}  // namespace detail

template <typename ModuleImpl>
class FaultTolerantFsdp : public detail::StepProtocol {
 public:
  using Fsdp = FullyShardedDataParallel<ModuleImpl>;
  // A new model, unsharded: the same structure at every call (its values do not matter).
  using MakeModel = std::function<std::shared_ptr<ModuleImpl>()>;
  // Makes the model's units over the epoch's group (e.g. fully_shard_each<...>).
  using MakeUnits = std::function<void(ModuleImpl&, const std::shared_ptr<ProcessGroup>&, const FsdpOptions&)>;
  // Runs forward and backward of one slice of the step's global batch through `fsdp`, its
  // loss the mean over the slice's rows; returns how many rows it trained on.
  using Train = std::function<int64_t(Fsdp& fsdp, const Slice& slice)>;
  // Where a resumed job starts: a checkpoint's full state dict, full optimizer state and step.
  struct Start {
    StateDict model;
    OptimizerState optimizer;
    int64_t step = 0;
  };

  // From make_model()'s values and no optimizer state at step 0, or from `start`.
  // `slices`: the fixed cut of every global batch (the job's full size).
  FaultTolerantFsdp(MakeModel make_model, MakeUnits make_units, OptimizerFactory make_optimizer,
                    ElasticGroup& elastic, int slices, FsdpOptions options = {},
                    std::optional<Start> start = std::nullopt)
      : StepProtocol(elastic, start ? start->step : 0),
        make_model_(std::move(make_model)),
        make_units_(std::move(make_units)),
        make_optimizer_(std::move(make_optimizer)),
        options_(options),
        slices_(slices),
        shard_size_(elastic.options().replica_group_size),
        keeper_(make_keeper(start)) {
    DATAPAR_CHECK(slices_ >= 1, "FaultTolerantFsdp: slices is ", slices_, "; give the job's full size.");
    options_.average_by_samples = false;  // the slices are weighed by their rows here
  }

  // As FaultTolerantDdp::train_step, with this epoch's FSDP: train(fsdp, slice) for each
  // pass of the step this member runs (a shadow among them when it has fewer slices).
  bool train_step(const Train& train, const BetweenSteps& before = {}) {
    return run_step([&](int rank, int size) { train_slices(train, rank, size); }, before);
  }
  // As FaultTolerantDdp::finish.
  void finish(const BetweenSteps& last = {}) { run_finish(last); }

  // The current membership epoch's FSDP and optimizer (over its shards).
  Fsdp& fsdp() { return *fsdp_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // Bytes of the previous rank's shard this rank keeps besides its own (parameters,
  // gradients, optimizer state).
  int64_t kept_bytes() const { return keeper_->kept_bytes(); }
  int slices() const { return slices_; }

  // As FaultTolerantDdp::use_grad_scaler; the overflow agreed over the membership (each
  // member checks the shards it keeps).
  using detail::StepProtocol::use_grad_scaler;

 private:
  std::unique_ptr<detail::FsdpShardKeeper> make_keeper(const std::optional<Start>& start) {
    StateDict model = start ? start->model : StateDict();
    OptimizerState optimizer = start ? start->optimizer : OptimizerState(c10::AnyType::get(), c10::AnyType::get());
    if (!start) {
      const std::shared_ptr<ModuleImpl> fresh = make_model_();
      model = state_dict(*fresh);
      optimizer = optimizer_state_dict(*make_optimizer_(fresh->parameters()));
    }
    if (shard_size_ > 1) return std::make_unique<detail::FsdpReplicas>(shard_size_, model, optimizer);
    return std::make_unique<detail::FsdpTwoCopies>(make_optimizer_, model, optimizer);
  }

  // This epoch's groups: the one its units shard over (the epoch's, or under HSDP this
  // member's replica group) and, under HSDP, the members of its index in every group.
  void make_groups() {
    const std::shared_ptr<ProcessGroup>& group = elastic_.group();
    shard_group_ = group;
    replicate_group_ = nullptr;
    if (shard_size_ == 1) return;
    const int rank = group->rank(), k = shard_size_;
    DATAPAR_CHECK(group->size() % k == 0 &&
                      elastic_.epoch().members.at(static_cast<size_t>(rank)).slot.index == rank % k,
                  "ft::FaultTolerantFsdp: membership epoch ", elastic_.epoch().number, " of ", group->size(),
                  " members is not whole replica groups of ", k, " in slot order.");
    std::vector<int> shard, replicate;
    for (int r = rank - rank % k; r < rank - rank % k + k; ++r) shard.push_back(r);
    for (int r = rank % k; r < group->size(); r += k) replicate.push_back(r);
    shard_group_ = elastic_.subgroup("shard", shard);
    replicate_group_ = elastic_.subgroup("replicate", replicate);
  }

  detail::FsdpParts parts(Fsdp& fsdp, torch::optim::Optimizer& optimizer) {
    detail::FsdpParts p;
    p.shards = fsdp.parameters();
    p.unit_numels.assign(p.shards.size(), 0);
    p.ranges = fsdp.shard_ranges();
    for (const ShardRange& range : p.ranges) {
      int64_t numel = 1;
      for (int64_t size : range.sizes) numel *= size;
      p.unit_numels.at(range.shard) += numel;
    }
    p.optimizer = &optimizer;
    p.module = fsdp.module().get();
    p.load_model = [&fsdp](const StateDict& state) { fsdp.load_full_state_dict(state); };
    p.load_optimizer = [&fsdp](torch::optim::Optimizer& o, const OptimizerState& s) {
      fsdp.load_full_optimizer_state(o, s);
    };
    return p;
  }

  bool ready() const override { return ready_; }
  void drop() override {
    ready_ = false;  // the shards stay: the next epoch takes them
    if (!fsdp_) return;
    // A step that failed leaves its slice's unsharded gradients: gone before the next
    // epoch's model is made.
    for (at::Tensor& p : fsdp_->module()->parameters()) p.mutable_grad() = at::Tensor();
  }

  void rebuild() override {
    const std::shared_ptr<ProcessGroup>& group = elastic_.group();
    make_groups();
    std::shared_ptr<ModuleImpl> model = make_model_();
    make_units_(*model, shard_group_, options_);
    auto fsdp = std::make_unique<Fsdp>(model, shard_group_, options_);
    std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer_(fsdp->parameters());
    const detail::FsdpParts next = parts(*fsdp, *optimizer);
    std::optional<detail::FsdpParts> current;
    if (fsdp_) current = parts(*fsdp_, *optimizer_);
    step_ = keeper_->rebuild(*group, elastic_.epoch().number, standing_, current ? &*current : nullptr, next,
                             [this] { apply_voted(); });
    gradients_.emplace(detail::slice_units(next), next.shards.front().options(), group->rank(), group->size(),
                       shard_size_ > 1 ? shard_size_ : 0);
    optimizer_ = std::move(optimizer);
    fsdp_ = std::move(fsdp);
    model_ = std::move(model);
    ready_ = true;
  }

  void train_slices(const Train& train, int rank, int size) {
    ProcessGroup& group = *elastic_.group();
    torch::nn::Module& module = *fsdp_->module();
    detail::broadcast_buffers(module, group, 0);  // rank 0's, as FaultTolerantDdp
    const SliceRange mine = slices_of(rank, size, slices_);
    const int passes = most_slices_of(size, slices_);
    gradients_->begin(slices_);
    std::vector<at::Tensor> first_buffers;  // after this member's first slice: rank 0's are the next step's
    {
      const auto unsharded = fsdp_->no_sync();
      for (int pass = 0; pass < passes; ++pass) {
        const bool shadow = mine.first + pass >= mine.last;
        const Slice slice{shadow ? std::min(mine.first, slices_ - 1) : mine.first + pass, slices_, shadow};
        const int64_t rows = train(*fsdp_, slice);
        gradients_->exchange(group, shadow ? 0 : rows, replicate_group_ ? shard_group_.get() : nullptr,
                             replicate_group_.get());
        if (pass == 0 && passes > 1) first_buffers = detail::copy_buffers(module);
      }
    }
    if (!first_buffers.empty()) detail::restore_buffers(module, first_buffers);
    std::vector<at::Tensor> shards = fsdp_->parameters();
    gradients_->reduce(shards, keeper_->kept_gradients());
  }

  void zero_grad() override { optimizer_->zero_grad(); }
  // This member's shards' gradients and those of the shards it keeps for the rank before.
  std::vector<at::Tensor> update_gradients() override {
    std::vector<at::Tensor> gradients;
    for (const at::Tensor& shard : fsdp_->parameters()) gradients.push_back(shard.grad());
    gradients.push_back(keeper_->kept_gradients());
    return gradients;
  }
  bool update_gradients_sharded() const override { return true; }
  void apply() override {
    optimizer_->step();
    keeper_->update();
  }

  MakeModel make_model_;
  MakeUnits make_units_;
  OptimizerFactory make_optimizer_;
  FsdpOptions options_;
  const int slices_;
  const int shard_size_;  // FtOptions::replica_group_size: > 1 for HSDP
  std::unique_ptr<detail::FsdpShardKeeper> keeper_;
  std::shared_ptr<ProcessGroup> shard_group_, replicate_group_;  // the current epoch's (make_groups)
  std::optional<detail::ShardedSliceGradients> gradients_;  // the current epoch's
  std::shared_ptr<ModuleImpl> model_;
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  bool ready_ = false;
};

}  // namespace datapar::ft
