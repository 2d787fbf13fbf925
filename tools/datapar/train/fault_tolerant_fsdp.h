// --mode fsdp --fault-tolerant: ft::FaultTolerantFsdp, each rank's shard kept by the next
// rank too, its units, options and checkpoint those of the fsdp mode (fsdp.h). --mode hsdp:
// the same over a membership of whole replica groups (the elastic group's), each sharding
// the model over itself, the replicas the copies.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>

#include "datapar/ft/fault_tolerant_fsdp.h"
#include "fault_tolerant_strategy.h"
#include "fsdp.h"

namespace datapar::tools {

template <typename Impl>
class FaultTolerantFsdpMode : public FaultTolerantStrategy {
 public:
  // Starts from `model` and `optimizer` (restored, if resumed) at `step`; each membership epoch
  // makes its own model, units and optimizer over its shards.
  FaultTolerantFsdpMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer,
                        ft::ElasticGroup& elastic, int64_t step)
      : trainer_([] { return std::make_shared<Impl>(); },
                 [](Impl& m, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options) {
                   shard_units(m, group, options);
                 },
                 optimizer_like(optimizer), elastic, plan.world_size, fsdp_options(plan.options),
                 typename Trainer::Start{state_dict(*model), optimizer_state_dict(optimizer), step}) {}

  int64_t committed_steps() const override { return trainer_.step(); }
  int64_t memberships_joined() const override { return trainer_.epochs_joined(); }
  bool train_step(const TrainSlice& train, const ft::BetweenSteps& before) override {
    return trainer_.train_step([&](typename Trainer::Fsdp&, const ft::Slice& slice) { return train(slice); }, before);
  }
  void finish(const ft::BetweenSteps& last) override { trainer_.finish(last); }
  void use_grad_scaler(amp::GradScaler* scaler) override { trainer_.use_grad_scaler(scaler); }

  at::Tensor forward(const at::Tensor& x) override { return trainer_.fsdp().forward(x); }
  torch::nn::Module& module() override { return *trainer_.fsdp().module(); }
  std::optional<train::Checkpoint> checkpoint(int64_t epoch) override {
    train::Checkpoint c = train::make_checkpoint(trainer_.fsdp(), trainer_.optimizer(), epoch);  // every member takes part
    if (trainer_.elastic().rank() != 0) return std::nullopt;
    return c;
  }

 private:
  using Trainer = ft::FaultTolerantFsdp<Impl>;

  Trainer trainer_;
};

}  // namespace datapar::tools
