// FaultTolerantDdp: data-parallel training that goes on when a member dies, hangs or joins
// (issue 31, docs/fault_tolerance.md). Each step is committed only if every live member
// finished its collectives for it; a failed step is trained again over the new membership,
// from the survivors' in-memory state (no checkpoint is read), and a member that (re)joins
// takes the model, optimizer state and step from a member at the newest step.
//
//   ft::ElasticGroup elastic(store, "run", options, [](auto store, int rank, int size) {
//     return datapar::new_gloo_process_group(store, rank, size);
//   });
//   auto model = std::make_shared<Net>();
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   ft::FaultTolerantDdp<Net> trainer(model, sgd, elastic, /*slices=*/3);
//   while (trainer.step() < steps) {
//     trainer.train_step([&](Net& net, const ft::Slice& slice) {
//       // slice.index of slice.count of global batch trainer.step(): rows
//       // [slice.begin(n), slice.end(n)) of its n rows
//       torch::mse_loss(net.forward(x), y).backward();  // the mean over the slice's rows
//       return rows;                                      // how many rows it trained on
//     });
//   }
//   trainer.finish();
//
// The training does not depend on who is alive, to the bit: each global batch is defined
// by the step alone and cut into `slices` fixed slices (the job's full size), each member
// trains its slices one at a time, and their gradients are summed in slice order
// (datapar/ft/slice_gradients.h). Buffers (BatchNorm's running statistics) are the first
// slice's, broadcast from rank 0 at each step, as DDP broadcasts rank 0's at each forward.
// The optimizer must be one optim/optimizer_state.h supports (SGD, Adam, AdamW) and hold
// the module's parameters.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/error.h"
#include "datapar/ft/elastic_group.h"
#include "datapar/ft/module_sync.h"
#include "datapar/ft/slice_gradients.h"
#include "datapar/ft/standing.h"
#include "datapar/ft/step_protocol.h"

namespace datapar::ft {
namespace detail {

// The state a joining member takes: the module's parameters and buffers, the optimizer's
// state (optim/optimizer_state.h) and the committed step, as the bytes of a torch.save file.
std::string save_training_state(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                                int64_t step);
// Loads what save_training_state wrote into `module` and `optimizer`; returns the step.
int64_t load_training_state(torch::nn::Module& module, torch::optim::Optimizer& optimizer, const std::string& bytes);

// Where reshard_zero() brought a member.
struct Resharded {
  int64_t step = 0;  // the newest committed step: every member is at it now
  int source = 0;    // the first rank that was at it (e.g. to take buffers from)
};

// Collective, after joining a membership epoch whose group is `group`: exchanges the
// members' standings and which parameters' state each keeps, applies a voted update another
// member committed by calling apply_missed_vote() (by default zero.update()) (Note [A voted step whose outcome a member
// missed], src/ft/standings.h),
// and re-shards `zero` over the group from the members at the newest step, every
// parameter's value from them too (a post-commit broadcast may have failed half way).
// `mine` follows what this member keeps: the update applied at once (a failure later must
// not apply it again), the newest step at the end. `zero` uses `group` until its next
// reshard (the ElasticGroup keeps it until the next join). Throws MembershipError when no
// member has the state of some parameter at the newest step (two neighbours lost at once),
// CommError or TimeoutError when a member fails meanwhile (join again with `mine`).
Resharded reshard_zero(ZeroRedundancyOptimizer& zero, ProcessGroup& group, Standing& mine,
                       const std::function<void()>& apply_missed_vote = {});

}  // namespace detail

template <typename ModuleImpl>
class FaultTolerantDdp : public detail::StepProtocol {
 public:
  // Runs forward and backward of one slice of the step's global batch on `module`, its loss
  // the mean over the slice's rows; returns how many rows it trained on.
  using Train = std::function<int64_t(ModuleImpl& module, const Slice& slice)>;

  // `slices`: the fixed cut of every global batch (the job's full size: each rank of an
  // undisturbed run trains one). Step 0 by default; a job resumed from a checkpoint passes
  // the checkpoint's step.
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, torch::optim::Optimizer& optimizer, ElasticGroup& elastic,
                   int slices, int64_t step = 0)
      : FaultTolerantDdp(std::move(module), &optimizer, nullptr, elastic, slices, step) {}
  // ZeRO-1: the optimizer state sharded over the members, each shard kept by two: `zero`
  // over the module's parameters, made without a group and with ZeroOptions::copies = 2
  // (datapar/ddp/zero_redundancy_optimizer.h); re-sharded over each membership.
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, ZeroRedundancyOptimizer& zero, ElasticGroup& elastic,
                   int slices, int64_t step = 0)
      : FaultTolerantDdp(std::move(module), nullptr, &zero, elastic, slices, step) {
    DATAPAR_CHECK(zero.copies() == 2, "ft::FaultTolerantDdp: the ZeroRedundancyOptimizer keeps ", zero.copies(),
                  " copy of each shard; fault tolerance needs 2 (ZeroOptions::copies), so that one member's loss "
                  "loses no state.");
  }

  // Trains step step(): joins a new epoch first when needed (taking the state of a member at
  // the newest step if this one is behind), runs `before` (if given; see below), takes rank
  // 0's buffers, calls train(module, slice) for each slice of the step this member trains
  // (in it, step() is the step it trains: a member that joined has taken it from the
  // others), sums the slices' gradients and votes; applies the optimizer's update only when
  // every member may commit. Returns whether the step was committed; if not, call again:
  // the step is trained anew over the new membership. Throws MembershipError when the job
  // cannot go on (below the minimum, the store gone, a shard's state lost), and whatever
  // `train` or `before` throws that is not a failure of a member.
  //
  // `before(rank, size)`: collectives every member runs together before training step
  // step() (an evaluation, gathering a checkpoint): once per step and membership epoch, so
  // again, by every member, a newcomer included, when a member fails in it or later in the
  // step. Whether it does anything must depend on step() alone.
  bool train_step(const Train& train, const BetweenSteps& before = {}) {
    return run_step([&](int rank, int size) { train_slices(train, rank, size); }, before);
  }

  // At the end of training, after the last train_step(): runs `last` (if given) as
  // train_step runs `before`, until every member has run it in one membership epoch, then
  // waits until every member is done (ElasticGroup::leave), so that no member is still in
  // the last vote when others exit.
  void finish(const BetweenSteps& last = {}) { run_finish(last); }

  int slices() const { return slices_; }

  // --amp fp16: train scales each slice's loss (scaler.scale(loss).backward()); the step's
  // update is skipped on every member when its gradients overflow (StepProtocol's).
  using detail::StepProtocol::use_grad_scaler;

 private:
  FaultTolerantDdp(std::shared_ptr<ModuleImpl> module, torch::optim::Optimizer* optimizer,
                   ZeroRedundancyOptimizer* zero, ElasticGroup& elastic, int slices, int64_t step)
      : StepProtocol(elastic, step), module_(std::move(module)), optimizer_(optimizer), zero_(zero),
        slices_(slices), gradients_(module_->parameters()) {
    DATAPAR_CHECK(slices_ >= 1, "FaultTolerantDdp: slices is ", slices_, "; give the job's full size.");
  }

  bool ready() const override { return ready_; }
  void drop() override { ready_ = false; }

  void rebuild() override {
    if (zero_) {
      const detail::Resharded resharded =
          detail::reshard_zero(*zero_, *elastic_.group(), standing_, [this] { apply_voted(); });
      step_ = resharded.step;
      detail::broadcast_buffers(*module_, *elastic_.group(), resharded.source);
    } else {
      const auto save = [&] { return detail::save_training_state(*module_, *optimizer_, step_); };
      const auto load = [&](const std::string& bytes) {
        step_ = detail::load_training_state(*module_, *optimizer_, bytes);
      };
      elastic_.take_newest_state(step_, save, load);
      // Members that start together take nothing: one model from here, whatever their seeds
      // (DDP's broadcast at construction).
      detail::broadcast_parameters(*module_, *elastic_.group(), 0);
    }
    ready_ = true;
  }

  void train_slices(const Train& train, int rank, int size) {
    ProcessGroup& group = *elastic_.group();
    detail::broadcast_buffers(*module_, group, 0);
    const SliceRange mine = slices_of(rank, size, slices_);
    gradients_.begin(rank, size, slices_);
    std::vector<at::Tensor> first_buffers;  // rank 0's after slice 0: what the next step starts from
    for (int i = mine.first; i < mine.last; ++i) {
      const int64_t rows = train(*module_, Slice{i, slices_});
      gradients_.keep(rows);
      if (i == 0 && mine.last > 1) first_buffers = detail::copy_buffers(*module_);
    }
    if (!first_buffers.empty()) detail::restore_buffers(*module_, first_buffers);
    gradients_.reduce(group);
  }

  void zero_grad() override {
    if (zero_) {
      zero_->zero_grad();
    } else {
      optimizer_->zero_grad();
    }
  }

  void apply() override {
    if (zero_) {
      zero_->update();
    } else {
      optimizer_->step();
    }
  }

  // Every member holds the whole step's gradients (reduce() sums them on all).
  std::vector<at::Tensor> update_gradients() override {
    std::vector<at::Tensor> gradients;
    for (const at::Tensor& p : module_->parameters()) gradients.push_back(p.grad());
    return gradients;
  }

  // Each owner's parameters to all. On a failure, joining again sets them (reshard()).
  void after_commit() override {
    if (zero_) zero_->share();
  }

  std::shared_ptr<ModuleImpl> module_;
  torch::optim::Optimizer* optimizer_;  // or
  ZeroRedundancyOptimizer* zero_;
  const int slices_;
  detail::SliceGradients gradients_;
  bool ready_ = false;
};

}  // namespace datapar::ft
