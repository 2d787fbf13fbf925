// FaultTolerantFsdp: fully sharded data parallel training (FSDP) that goes on when a member
// dies, hangs or joins (issue 31, docs/fault_tolerance.md), with the step protocol of
// FaultTolerantDdp. FSDP keeps 1/n of the parameters, gradients and optimizer state on each
// rank, so a death would lose a shard of the model itself: here each rank also keeps the
// shard of the rank before it (its parameters and optimizer state), receives that rank's
// reduced gradient shard before each vote (an all-gather per unit: Note [Sending a gradient
// shard to the next rank] in src/ft/fsdp_keeper.cc) and updates both on a commit. One failure at a time loses nothing: after a membership change every
// member takes the newest state from the members that kept each shard and the model is
// sharded anew over the new membership. Two neighbours lost at once lose a shard: the job
// stops with a MembershipError that says so (resume it from the last checkpoint).
//
//   ft::FaultTolerantFsdp<Net> trainer(
//       [] { return std::make_shared<Net>(); },                                  // the model, unsharded
//       [](Net& net, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options) {
//         fully_shard_each<torch::nn::LinearImpl>(net, group, options);          // its units
//       },
//       [](std::vector<at::Tensor> shards) {
//         return std::make_unique<torch::optim::SGD>(shards, torch::optim::SGDOptions(0.1).momentum(0.9));
//       },
//       elastic);
//   while (trainer.step() < steps) {
//     trainer.train_step([&](FullyShardedDataParallel<Net>& fsdp, int rank, int size) {
//       torch::mse_loss(fsdp.forward(x), y).backward();  // this rank's share of global batch step()
//     });
//   }
//   trainer.finish();
//
// Each membership epoch makes its own model (make_model), units (make_units, over the
// epoch's group) and FSDP root, and an optimizer over its shards (SGD, Adam or AdamW, one
// group): fsdp() and optimizer() are the current epoch's (use them inside train, before and
// last). Memory: 2/n of the parameters and optimizer state per rank between steps; while
// the members regroup, the whole model and optimizer state on each (as a full state dict is).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/ft/step_protocol.h"
#include "datapar/state_dict.h"
#include "datapar/train/optimizer_state.h"

namespace datapar::ft {
namespace detail {

// One membership epoch's FSDP, as FsdpKeeper sees it.
struct FsdpParts {
  std::vector<at::Tensor> shards;  // fsdp.parameters(): one flat shard per unit
  std::vector<int64_t> unit_numels;  // each unit's parameters' elements (unpadded)
  torch::optim::Optimizer* optimizer = nullptr;  // over `shards`
  torch::nn::Module* module = nullptr;           // for the buffers
  std::function<void(const StateDict&)> load_model;
  std::function<void(torch::optim::Optimizer&, const train::OptimizerState&)> load_optimizer;
};

// The non-template part of FaultTolerantFsdp: the previous rank's shard this member keeps,
// and the state's moves at a membership change.
class FsdpKeeper {
 public:
  // Keeps the whole state to start from (a full state dict and a full optimizer state, as
  // FullyShardedDataParallel::load_full_* take them) at step `step`.
  FsdpKeeper(ShardedOptimizer::Factory make_optimizer, StateDict model, train::OptimizerState optimizer);
  ~FsdpKeeper();
  FsdpKeeper(FsdpKeeper&&) noexcept;
  FsdpKeeper(const FsdpKeeper&) = delete;
  FsdpKeeper& operator=(const FsdpKeeper&) = delete;

  // Collective, after joining epoch `epoch` whose group is `group`: brings `next` (this
  // epoch's FSDP, made over `group`) to the newest step and keeps the previous rank's
  // shard of it. `current`: the epoch before's (null before the first). `mine` follows
  // what this member keeps, as ShardedOptimizer::reshard's. Returns the newest step.
  // MembershipError when no member keeps some shard at the newest step.
  int64_t rebuild(ProcessGroup& group, int64_t epoch, Standing& mine, const FsdpParts* current,
                  const FsdpParts& next);

  // After backward: this rank's gradient shards to the next rank, the previous rank's
  // from it, into the kept shard's gradients.
  void exchange_gradients(ProcessGroup& group, const std::vector<at::Tensor>& shards);
  // The committed step's update of the kept shard.
  void update();
  // Bytes of the previous rank's shard kept here: its parameters, gradients and state.
  int64_t kept_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace detail

template <typename ModuleImpl>
class FaultTolerantFsdp : public detail::StepProtocol {
 public:
  using Fsdp = FullyShardedDataParallel<ModuleImpl>;
  // A new model, unsharded: the same structure at every call (its values do not matter).
  using MakeModel = std::function<std::shared_ptr<ModuleImpl>()>;
  // Makes the model's units over the epoch's group (e.g. fully_shard_each<...>).
  using MakeUnits = std::function<void(ModuleImpl&, const std::shared_ptr<ProcessGroup>&, const FsdpOptions&)>;
  // Runs forward and backward of the step on this rank's share: train(fsdp, rank, size).
  using Train = std::function<void(Fsdp&, int rank, int size)>;
  // Where a resumed job starts: a checkpoint's full state dict, full optimizer state and step.
  struct Start {
    StateDict model;
    train::OptimizerState optimizer;
    int64_t step = 0;
  };

  // From make_model()'s values and no optimizer state at step 0, or from `start`.
  FaultTolerantFsdp(MakeModel make_model, MakeUnits make_units, ShardedOptimizer::Factory make_optimizer,
                    ElasticGroup& elastic, FsdpOptions options = {}, std::optional<Start> start = std::nullopt)
      : StepProtocol(elastic, start ? start->step : 0),
        make_model_(std::move(make_model)),
        make_units_(std::move(make_units)),
        make_optimizer_(std::move(make_optimizer)),
        options_(options),
        keeper_(make_keeper(start)) {
    options_.average_by_samples = true;
  }

  // As FaultTolerantDdp::train_step, with this epoch's FSDP.
  bool train_step(const Train& train, const Together& before = {}) {
    return run_step([&](int rank, int size) { train(*fsdp_, rank, size); }, before);
  }
  // As FaultTolerantDdp::finish.
  void finish(const Together& last = {}) { run_finish(last); }

  // The current membership epoch's FSDP and optimizer (over its shards).
  Fsdp& fsdp() { return *fsdp_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // Bytes of the previous rank's shard this rank keeps besides its own (parameters,
  // gradients, optimizer state).
  int64_t kept_bytes() const { return keeper_.kept_bytes(); }

 private:
  detail::FsdpKeeper make_keeper(const std::optional<Start>& start) {
    if (start) return detail::FsdpKeeper(make_optimizer_, start->model, start->optimizer);
    const std::shared_ptr<ModuleImpl> model = make_model_();
    const std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer_(model->parameters());
    return detail::FsdpKeeper(make_optimizer_, state_dict(*model), train::optimizer_state_dict(*optimizer));
  }

  detail::FsdpParts parts(Fsdp& fsdp, torch::optim::Optimizer& optimizer) {
    detail::FsdpParts p;
    p.shards = fsdp.parameters();
    p.unit_numels.assign(p.shards.size(), 0);
    for (const ShardRange& range : fsdp.shard_ranges()) {
      int64_t numel = 1;
      for (int64_t size : range.sizes) numel *= size;
      p.unit_numels.at(range.shard) += numel;
    }
    p.optimizer = &optimizer;
    p.module = fsdp.module().get();
    p.load_model = [&fsdp](const StateDict& state) { fsdp.load_full_state_dict(state); };
    p.load_optimizer = [&fsdp](torch::optim::Optimizer& o, const train::OptimizerState& s) {
      fsdp.load_full_optimizer_state(o, s);
    };
    return p;
  }

  bool ready() const override { return ready_; }
  void drop() override { ready_ = false; }  // the shards stay: the next epoch takes them

  void rebuild() override {
    const std::shared_ptr<ProcessGroup>& group = elastic_.group();
    std::shared_ptr<ModuleImpl> model = make_model_();
    make_units_(*model, group, options_);
    auto fsdp = std::make_unique<Fsdp>(model, group, options_);
    std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer_(fsdp->parameters());
    const detail::FsdpParts next = parts(*fsdp, *optimizer);
    std::optional<detail::FsdpParts> current;
    if (fsdp_) current = parts(*fsdp_, *optimizer_);
    step_ = keeper_.rebuild(*group, elastic_.epoch().number, standing_, current ? &*current : nullptr, next);
    optimizer_ = std::move(optimizer);
    fsdp_ = std::move(fsdp);
    model_ = std::move(model);
    ready_ = true;
  }

  void zero_grad() override { optimizer_->zero_grad(); }
  void before_vote() override { keeper_.exchange_gradients(*elastic_.group(), fsdp_->parameters()); }
  void apply() override {
    optimizer_->step();
    keeper_.update();
  }

  MakeModel make_model_;
  MakeUnits make_units_;
  ShardedOptimizer::Factory make_optimizer_;
  FsdpOptions options_;
  detail::FsdpKeeper keeper_;
  std::shared_ptr<ModuleImpl> model_;
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  bool ready_ = false;
};

}  // namespace datapar::ft
