// FaultTolerantDdp: DDP training that goes on when a member dies, hangs or joins (issue 31,
// docs/fault_tolerance.md). Each step is committed only if every live member finished its
// collectives for it; a failed step is trained again over the new membership, from the
// survivors' in-memory state (no checkpoint is read), and a member that (re)joins takes the
// model, optimizer state and step from a member at the newest step.
//
//   ft::ElasticGroup elastic(store, "run", options, [](auto store, int rank, int size) {
//     return datapar::new_gloo_process_group(store, rank, size);
//   });
//   auto model = std::make_shared<Net>();
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   ft::FaultTolerantDdp<Net> trainer(model, sgd, elastic);
//   while (trainer.step() < steps) {
//     trainer.train_step([&](DistributedDataParallel<Net>& ddp, int rank, int size) {
//       // this rank's share of global batch trainer.step(), cut over `size` ranks
//       torch::mse_loss(ddp.forward(x), y).backward();
//     });
//   }
//   trainer.finish();
//
// For the trajectory not to depend on who is alive, define each global batch by the step
// alone and cut it over the ranks of the moment; gradients are averaged by samples
// (DdpOptions::average_by_samples is always on), so a step over 2 ranks equals the step over
// 3 within float round-off. The optimizer must be one train/optimizer_state.h supports
// (SGD, Adam, AdamW) and hold the module's parameters.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/error.h"
#include "datapar/ft/elastic_group.h"
#include "datapar/ft/sharded_optimizer.h"
#include "datapar/ft/step_protocol.h"

namespace datapar::ft {
namespace detail {

// The state a joining member takes: the module's parameters and buffers, the optimizer's
// state (train/optimizer_state.h) and the committed step, as the bytes of a torch.save file.
std::string save_training_state(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                                int64_t step);
// Loads what save_training_state wrote into `module` and `optimizer`; returns the step.
int64_t load_training_state(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::string& bytes);

// Collective: the module's buffers (e.g. BatchNorm's running statistics) from `root`.
void broadcast_buffers(torch::nn::Module& module, ProcessGroup& group, int root);

}  // namespace detail

template <typename ModuleImpl>
class FaultTolerantDdp : public detail::StepProtocol {
 public:
  using Ddp = DistributedDataParallel<ModuleImpl>;
  // Runs forward and backward of the step on this rank's share: train(ddp, rank, size).
  using Train = std::function<void(Ddp&, int rank, int size)>;

  // Step 0 by default; a job resumed from a checkpoint passes the checkpoint's step.
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, torch::optim::Optimizer& optimizer, ElasticGroup& elastic,
                   DdpOptions options = {}, int64_t step = 0)
      : FaultTolerantDdp(std::move(module), &optimizer, nullptr, elastic, options, step) {}
  // ZeRO-1: the optimizer state sharded over the members, each shard kept by two
  // (datapar/ft/sharded_optimizer.h), over the module's parameters.
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, ShardedOptimizer& sharded, ElasticGroup& elastic,
                   DdpOptions options = {}, int64_t step = 0)
      : FaultTolerantDdp(std::move(module), nullptr, &sharded, elastic, options, step) {}

  // Trains step step(): joins a new epoch first when needed (taking the state of a member at
  // the newest step if this one is behind), runs `before` (if given; see below), zeroes the
  // gradients, calls train(ddp, rank, size) to run forward and backward on this rank's share
  // of the step's global batch (in it, step() is the step it trains: a member that joined
  // has taken it from the others), and votes; applies the optimizer's update only when every
  // member may commit. Returns whether the step was committed; if not, call again: the step
  // is trained anew over the new membership. Throws MembershipError when the job cannot go on
  // (below the minimum, the store gone, a shard's state lost), and whatever `train` or
  // `before` throws that is not a failure of a member.
  //
  // `before(rank, size)`: collectives every member runs together before training step
  // step() (an evaluation, gathering a checkpoint): once per step and membership epoch, so
  // again, by every member, a newcomer included, when a member fails in it or later in the
  // step. Whether it does anything must depend on step() alone.
  bool train_step(const Train& train, const Together& before = {}) {
    return run_step([&](int rank, int size) { train(*ddp_, rank, size); }, before);
  }

  // At the end of training, after the last train_step(): runs `last` (if given) as
  // train_step runs `before`, until every member has run it in one membership epoch, then
  // waits until every member is done (ElasticGroup::leave), so that no member is still in
  // the last vote when others exit.
  void finish(const Together& last = {}) { run_finish(last); }

 private:
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, torch::optim::Optimizer* optimizer, ShardedOptimizer* sharded,
                   ElasticGroup& elastic, DdpOptions options, int64_t step)
      : StepProtocol(elastic, step), module_(std::move(module)), optimizer_(optimizer), sharded_(sharded),
        options_(options) {
    options_.average_by_samples = true;
  }

  bool ready() const override { return ddp_.has_value(); }
  void drop() override { ddp_.reset(); }

  void rebuild() override {
    if (sharded_) {
      const ShardedOptimizer::Resharded resharded = sharded_->reshard(*elastic_.group(), standing_);
      step_ = resharded.step;
      detail::broadcast_buffers(*module_, *elastic_.group(), resharded.source);
    } else {
      elastic_.heal([&] { return detail::save_training_state(*module_, *optimizer_, step_); },
                    [&](const std::string& bytes) { step_ = detail::load_training_state(*module_, *optimizer_, bytes); });
    }
    ddp_.emplace(module_, elastic_.group(), options_);
  }

  void zero_grad() override {
    if (sharded_) {
      sharded_->zero_grad();
    } else {
      optimizer_->zero_grad();
    }
  }

  void apply() override {
    if (sharded_) {
      sharded_->update();
    } else {
      optimizer_->step();
    }
  }

  // Each owner's parameters to all. On a failure, joining again sets them (reshard()).
  void after_commit() override {
    if (sharded_) sharded_->share(*elastic_.group());
  }

  std::shared_ptr<ModuleImpl> module_;
  torch::optim::Optimizer* optimizer_;  // or
  ShardedOptimizer* sharded_;
  DdpOptions options_;
  std::optional<Ddp> ddp_;
};

}  // namespace datapar::ft
