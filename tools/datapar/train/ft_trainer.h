// The fault-tolerant modes (--fault-tolerant, docs/fault_tolerance.md) as the fault-tolerant
// loop (fault_tolerant_loop.h) sees them: ft::FaultTolerantDdp (--mode ddp, with or without
// --zero) or ft::FaultTolerantFsdp (--mode fsdp) over the model of the run's type.
#pragma once

#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <optional>

#include "../train.h"
#include "datapar/ft/fault_tolerant_ddp.h"
#include "datapar/ft/fault_tolerant_fsdp.h"
#include "datapar/train/checkpoint.h"
#include "evaluation.h"
#include "fsdp.h"

namespace datapar::tools {

// What the fault-tolerant loop needs of its trainer, whatever the mode and model. The
// trainer lives in `owned`.
struct FtTrainer {
  std::function<int64_t()> step, epochs_joined;
  // train(forward, slice) trains one fixed slice of the step's global batch (ft/slice_gradients.h)
  // and returns its rows; a shadow slice is trained but not counted.
  using Part = std::function<int64_t(const Forward&, const ft::Slice& slice)>;
  std::function<bool(const Part&, const ft::Together&)> train_step;
  std::function<void(const ft::Together&)> finish;
  Forward forward;                               // this epoch's, for evaluation
  std::function<torch::nn::Module&()> module;    // this epoch's
  // Collective: the checkpoint of the model and optimizer now, on the epoch's rank 0.
  std::function<std::optional<train::Checkpoint>(int64_t epoch)> checkpoint;
  std::shared_ptr<void> owned;
};

// What every fault-tolerant trainer answers alike (ft::detail::StepProtocol): its step, the
// memberships it joined, and its finish. `trainer` lives in t.owned.
template <typename Trainer>
void bind_step_protocol(FtTrainer& t, Trainer* trainer) {
  t.step = [trainer] { return trainer->step(); };
  t.epochs_joined = [trainer] { return trainer->epochs_joined(); };
  t.finish = [trainer](const ft::Together& last) { trainer->finish(last); };
}

// --mode fsdp: each rank's shard kept by the next rank too.
template <typename Impl>
FtTrainer make_ft_fsdp(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd,
                       ft::ElasticGroup& elastic, int64_t step, const OptimizerFactory& make_sgd) {
  const TrainOptions& o = plan.options;
  FtTrainer t;
  using Trainer = ft::FaultTolerantFsdp<Impl>;
  FsdpOptions fsdp_options;
  fsdp_options.reshard_after_forward = o.reshard;
  // The units of the fsdp mode; the model starts from `model` and `sgd` (resumed).
  auto trainer = std::make_shared<Trainer>(
      [] { return std::make_shared<Impl>(); },
      [](Impl& m, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& unit_options) {
        shard_units(m, group, unit_options);
      },
      make_sgd, elastic, plan.world_size, fsdp_options,
      typename Trainer::Start{state_dict(*model), optimizer_state_dict(sgd), step});
  t.train_step = [trainer](const FtTrainer::Part& train, const ft::Together& before) {
    return trainer->train_step(
        [&](FullyShardedDataParallel<Impl>& fsdp, const ft::Slice& slice) {
          return train([&](const at::Tensor& x) { return fsdp.forward(x); }, slice);
        },
        before);
  };
  t.forward = [trainer](const at::Tensor& x) { return trainer->fsdp().forward(x); };
  t.module = [trainer]() -> torch::nn::Module& { return *trainer->fsdp().module(); };
  t.checkpoint = [trainer, &elastic](int64_t epoch) -> std::optional<train::Checkpoint> {
    train::Checkpoint c;
    c.model = trainer->fsdp().full_state_dict();
    c.optimizer = trainer->fsdp().full_optimizer_state(trainer->optimizer());
    if (elastic.rank() != 0) return std::nullopt;
    c.epoch = epoch;
    c.rng = train::get_rng_state();
    return c;
  };
  bind_step_protocol(t, trainer.get());
  t.owned = trainer;
  return t;
}

// --mode ddp: the optimizer whole on every rank, or under --zero sharded, each shard kept twice.
template <typename Impl>
FtTrainer make_ft_ddp(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd,
                      ft::ElasticGroup& elastic, int64_t step, const OptimizerFactory& make_sgd) {
  const TrainOptions& o = plan.options;
  FtTrainer t;
  using Trainer = ft::FaultTolerantDdp<Impl>;
  struct Ddp {
    std::unique_ptr<ZeroRedundancyOptimizer> zero;
    std::unique_ptr<Trainer> trainer;
  };
  auto ddp = std::make_shared<Ddp>();
  // Each global batch in the job's full size of slices, whoever is alive (Note [Gradients
  // that do not depend on who is alive] in src/ft/slice_gradients.cc).
  if (o.zero) {
    ZeroOptions two_copies;
    two_copies.copies = 2;
    ddp->zero = std::make_unique<ZeroRedundancyOptimizer>(model->parameters(), make_sgd, two_copies);
    ddp->zero->load_full_state(sgd);  // what resume() restored, if anything
    ddp->trainer = std::make_unique<Trainer>(model, *ddp->zero, elastic, plan.world_size, step);
  } else {
    ddp->trainer = std::make_unique<Trainer>(model, sgd, elastic, plan.world_size, step);
  }
  Trainer* trainer = ddp->trainer.get();
  t.train_step = [trainer](const FtTrainer::Part& train, const ft::Together& before) {
    return trainer->train_step(
        [&](Impl& m, const ft::Slice& slice) {
          return train([&](const at::Tensor& x) { return m.forward(x); }, slice);
        },
        before);
  };
  t.forward = [model](const at::Tensor& x) { return model->forward(x); };
  t.module = [model]() -> torch::nn::Module& { return *model; };
  ZeroRedundancyOptimizer* zero = ddp->zero.get();
  t.checkpoint = [zero, model, &sgd, &elastic](int64_t epoch) -> std::optional<train::Checkpoint> {
    const std::unique_ptr<torch::optim::Optimizer> gathered = zero ? zero->consolidate(0) : nullptr;
    if (elastic.rank() != 0) return std::nullopt;
    return train::make_checkpoint(*model, gathered ? *gathered : sgd, epoch);
  };
  bind_step_protocol(t, trainer);
  t.owned = ddp;
  return t;
}

// The trainer of plan.mode, from `model` and `sgd` (restored, if resumed) at `step`.
template <typename Impl>
FtTrainer make_ft_trainer(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd,
                          ft::ElasticGroup& elastic, int64_t step) {
  const auto options = static_cast<const torch::optim::SGDOptions&>(sgd.defaults());
  const OptimizerFactory make_sgd = [options](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(std::move(p), options);
  };
  return plan.mode == Mode::kFsdp ? make_ft_fsdp(plan, std::move(model), sgd, elastic, step, make_sgd)
                                  : make_ft_ddp(plan, std::move(model), sgd, elastic, step, make_sgd);
}

}  // namespace datapar::tools
