// --mode ddp --fault-tolerant --sync-every H (issue 48): ft::FaultTolerantDiLoCo over the
// model and its (inner) optimizer, each member a replica. The protocol's step is one
// round; the loop (fault_tolerant_loop.h) counts global batches, so a round is the next H
// global batches, or fewer at an epoch's end (rounds stop there, so that the epoch's end,
// its evaluation and checkpoint, falls on a round boundary and sees the outer parameters):
// the steps committed are a fixed function of the rounds committed. In each inner step a
// member trains its share of the global batch: the slices a rank of the job's full size
// would train (ft::slices_of over the membership it trains the round in), their gradients
// weighted by rows. A member lost in the middle of a round costs its own inner steps only:
// the others average the round again over themselves and go on.
//
// Checkpoints: rank 0's model (every member's is the outer parameters at a round boundary)
// and inner optimizer state, and beside it DiLoCo's state (ft-diloco-epoch-E.pt: the outer
// parameters, the outer momentum, the round), which --resume reads back; every member then
// starts from rank 0's inner optimizer state.
#pragma once

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "datapar/ft/fault_tolerant_diloco.h"
#include "datapar/state_dict.h"
#include "ddp.h"
#include "diloco.h"
#include "fault_tolerant_strategy.h"
#include "file_system.h"

namespace datapar::tools {

// DiLoCo's state beside the checkpoint of `epoch` epochs under --fault-tolerant.
inline std::string fault_tolerant_diloco_state_path(const TrainPlan& plan, int64_t epoch) {
  return plan.options.checkpoint_dir + "/ft-diloco-epoch-" + std::to_string(epoch) + ".pt";
}

template <typename Impl>
class FaultTolerantDiLoCoMode : public FaultTolerantStrategy {
 public:
  // From `model` and `optimizer` (restored, if resumed) at `step`, a multiple of `steps_per_epoch`
  // (the global batches of an epoch); resumed (step > 0) from DiLoCo's state beside the
  // checkpoint.
  FaultTolerantDiLoCoMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer,
                          ft::ElasticGroup& elastic, int64_t step, int64_t steps_per_epoch)
      : plan_(plan),
        model_(model),
        optimizer_(optimizer),
        per_epoch_(steps_per_epoch),
        sync_every_(plan.options.sync_every),
        rounds_per_epoch_((steps_per_epoch + plan.options.sync_every - 1) / plan.options.sync_every) {
    const DiLoCoOptions options = diloco_options(plan.options);
    if (step == 0) {
      trainer_ = std::make_unique<Trainer>(model, optimizer, elastic, options);
      return;
    }
    const int64_t epoch = step / per_epoch_;
    const std::string path = fault_tolerant_diloco_state_path(plan, epoch);
    DATAPAR_CHECK(datapar::detail::exists(path), "no DiLoCo state beside the checkpoint of epoch ", epoch, " (",
                  path, "): --fault-tolerant --sync-every resumes the outer parameters and momentum from it.",
                  "\n---> HINT: resume from a checkpoint that a --fault-tolerant --sync-every run wrote, or start ",
                  "over without --resume.");
    trainer_ = std::make_unique<Trainer>(model, optimizer, elastic, options, load_state_dict_file(path));
    DATAPAR_CHECK(steps_at(trainer_->round()) == step, path, " holds round ", trainer_->round(),
                  ", not the end of epoch ", epoch, " in rounds of --sync-every ", sync_every_,
                  ".\n---> HINT: resume with the --sync-every and --batch-size of the run that wrote it.");
  }

  int64_t committed_steps() const override { return steps_at(trainer_->round()); }
  int64_t training_step() const override { return in_round_ ? training_step_ : committed_steps(); }
  int64_t memberships_joined() const override { return trainer_->epochs_joined(); }
  // One round, averaged again over the new membership until it commits (its inner steps are
  // not trained again): always true.
  bool train_step(const TrainSlice& train, const ft::BetweenSteps& before) override {
    while (!trainer_->train_round([&](int rank, int size) { inner_steps(train, rank, size); }, before)) {
    }
    return true;
  }
  void finish(const ft::BetweenSteps& last) override { trainer_->finish(last); }

  at::Tensor forward(const at::Tensor& x) override { return model_->forward(x); }
  torch::nn::Module& module() override { return *model_; }
  std::optional<train::Checkpoint> checkpoint(int64_t epoch) override {
    if (trainer_->elastic().rank() != 0) return std::nullopt;
    save_state_dict(trainer_->state_dict(), fault_tolerant_diloco_state_path(plan_, epoch));  // atomic
    return train::make_checkpoint(*model_, optimizer_, epoch);
  }

 private:
  using Trainer = ft::FaultTolerantDiLoCo;

  // The global batches committed after `round` rounds.
  int64_t steps_at(int64_t round) const {
    return round / rounds_per_epoch_ * per_epoch_ + std::min((round % rounds_per_epoch_) * sync_every_, per_epoch_);
  }

  // This member's inner steps of the current round, as `rank` of `size` members.
  void inner_steps(const TrainSlice& train, int rank, int size) {
    const int64_t round = trainer_->round();
    const ft::SliceRange mine = ft::slices_of(rank, size, plan_.world_size);
    in_round_ = true;
    try {
      for (int64_t step = steps_at(round), end = steps_at(round + 1); step < end; ++step) {
        training_step_ = step;
        optimizer_.zero_grad();
        if (mine.last - mine.first == 1) {
          train(ft::Slice{mine.first, plan_.world_size});
        } else {
          train_slices(train, mine);
        }
        optimizer_.step();
      }
    } catch (...) {
      in_round_ = false;
      throw;
    }
    in_round_ = false;
  }

  // Several slices (fewer members than the job's size): each one's gradient weighted by its
  // rows, as one pass over them all would give.
  void train_slices(const TrainSlice& train, const ft::SliceRange& mine) {
    const std::vector<at::Tensor> params = model_->parameters();
    std::vector<at::Tensor> sum;
    int64_t rows = 0;
    for (int i = mine.first; i < mine.last; ++i) {
      const int64_t n = train(ft::Slice{i, plan_.world_size});
      const torch::NoGradGuard no_grad;
      for (size_t p = 0; p < params.size(); ++p) {
        if (sum.size() < params.size()) sum.push_back(at::zeros_like(params[p]));
        const at::Tensor& grad = params[p].grad();
        if (!grad.defined()) continue;
        sum[p].add_(grad, static_cast<double>(n));
        params[p].mutable_grad().zero_();
      }
      rows += n;
    }
    if (rows == 0) return;
    const torch::NoGradGuard no_grad;
    for (size_t p = 0; p < sum.size(); ++p) params[p].mutable_grad() = sum[p].div_(static_cast<double>(rows));
  }

  const TrainPlan& plan_;
  std::shared_ptr<Impl> model_;
  torch::optim::Optimizer& optimizer_;
  const int64_t per_epoch_, sync_every_, rounds_per_epoch_;
  std::unique_ptr<Trainer> trainer_;
  bool in_round_ = false;       // in inner_steps
  int64_t training_step_ = 0;   // the global batch inner_steps trains
};

}  // namespace datapar::tools
