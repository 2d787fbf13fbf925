// --mode ddp --fault-tolerant: ft::FaultTolerantDdp over the model and its optimizer, whole on
// every member, or under --zero over ZeRO-1 with each shard kept by two members (ddp.h's
// make_zero with 2 copies).
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>

#include "datapar/ft/fault_tolerant_ddp.h"
#include "ddp.h"
#include "fault_tolerant_strategy.h"

namespace datapar::tools {

template <typename Impl>
class FaultTolerantDdpMode : public FaultTolerantStrategy {
 public:
  // From `model` and `optimizer` (restored, if resumed) at `step`. Each global batch is cut into
  // the job's full size of slices, whoever is alive (Note [Gradients that do not depend on
  // who is alive] in src/ft/slice_gradients.cc).
  FaultTolerantDdpMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer,
                       ft::ElasticGroup& elastic, int64_t step)
      : model_(model), optimizer_(optimizer) {
    if (plan.options.zero) {
      zero_ = make_zero(model->parameters(), optimizer, /*copies=*/2);
      trainer_ = std::make_unique<Trainer>(std::move(model), *zero_, elastic, plan.world_size, step);
    } else {
      trainer_ = std::make_unique<Trainer>(std::move(model), optimizer, elastic, plan.world_size, step);
    }
  }

  int64_t committed_steps() const override { return trainer_->step(); }
  int64_t memberships_joined() const override { return trainer_->epochs_joined(); }
  bool train_step(const TrainSlice& train, const ft::BetweenSteps& before) override {
    return trainer_->train_step([&](Impl&, const ft::Slice& slice) { return train(slice); }, before);
  }
  void finish(const ft::BetweenSteps& last) override { trainer_->finish(last); }
  void use_grad_scaler(amp::GradScaler* scaler) override { trainer_->use_grad_scaler(scaler); }

  at::Tensor forward(const at::Tensor& x) override { return model_->forward(x); }
  torch::nn::Module& module() override { return *model_; }
  // Under --zero the whole state is gathered on rank 0 first, every member taking part.
  std::optional<train::Checkpoint> checkpoint(int64_t epoch) override {
    if (zero_) return zero_checkpoint(*model_, *zero_, epoch);
    if (trainer_->elastic().rank() != 0) return std::nullopt;
    return train::make_checkpoint(*model_, optimizer_, epoch);
  }

 private:
  using Trainer = ft::FaultTolerantDdp<Impl>;

  std::shared_ptr<Impl> model_;
  torch::optim::Optimizer& optimizer_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;  // under --zero
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace datapar::tools
