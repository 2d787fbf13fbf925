// The strategy of the run's --mode (strategy.h), or under --fault-tolerant its
// fault-tolerant one (fault_tolerant_strategy.h): one line per mode.
#pragma once

#include <memory>

#include "data_parallel.h"
#include "ddp.h"
#include "diloco.h"
#include "fault_tolerant_ddp.h"
#include "fault_tolerant_diloco.h"
#include "fault_tolerant_fsdp.h"
#include "fsdp.h"
#include "single_device.h"

namespace datapar::tools {

// Wraps `model` (restored already) and `optimizer` for plan.mode.
template <typename Impl>
std::unique_ptr<Strategy> make_strategy(const TrainPlan& plan, std::shared_ptr<Impl> model,
                                        torch::optim::Optimizer& optimizer) {
  switch (plan.mode) {
    case Mode::kSingle: return std::make_unique<SingleDevice<Impl>>(plan, std::move(model), optimizer);
    case Mode::kDataParallel: return std::make_unique<DataParallelMode<Impl>>(plan, std::move(model), optimizer);
    case Mode::kDdp:
      if (plan.options.sync_every > 0) {  // each rank a replica
        return std::make_unique<DiLoCoMode<SingleDevice<Impl>>>(default_group(), plan, std::move(model), optimizer);
      }
      return std::make_unique<DdpMode<Impl>>(plan, std::move(model), optimizer);
    case Mode::kFsdp: return std::make_unique<FsdpMode<Impl>>(plan, std::move(model), optimizer);
    case Mode::kHsdp: {
      const HybridGroups groups = hybrid_groups(plan.shard_size);
      if (plan.options.sync_every > 0) {  // each shard group a replica: FSDP within it, DiLoCo across
        return std::make_unique<DiLoCoMode<FsdpMode<Impl>>>(groups.replicate, plan, std::move(model), optimizer,
                                                            HybridGroups{groups.shard, nullptr});
      }
      return std::make_unique<FsdpMode<Impl>>(plan, std::move(model), optimizer, groups);
    }
  }
  return nullptr;
}

// Wraps `model` (restored already) and `optimizer` at `step` for plan.mode under --fault-tolerant
// (ddp, fsdp or hsdp: plan_training refuses the others), over the membership of `elastic`
// (hsdp: whole replica groups, FtOptions::replica_group_size); `steps_per_epoch`: the global
// batches of an epoch (--sync-every's rounds end with each epoch).
template <typename Impl>
std::unique_ptr<FaultTolerantStrategy> make_fault_tolerant(const TrainPlan& plan, std::shared_ptr<Impl> model,
                                                           torch::optim::Optimizer& optimizer, ft::ElasticGroup& elastic,
                                                           int64_t step, int64_t steps_per_epoch) {
  switch (plan.mode) {
    case Mode::kDdp:
      if (plan.options.sync_every > 0) {  // each member a replica: DiLoCo, a round a step
        return std::make_unique<FaultTolerantDiLoCoMode<Impl>>(plan, std::move(model), optimizer, elastic, step,
                                                               steps_per_epoch);
      }
      return std::make_unique<FaultTolerantDdpMode<Impl>>(plan, std::move(model), optimizer, elastic, step);
    case Mode::kFsdp:
    case Mode::kHsdp:
      return std::make_unique<FaultTolerantFsdpMode<Impl>>(plan, std::move(model), optimizer, elastic, step);
    case Mode::kSingle:
    case Mode::kDataParallel: break;
  }
  return nullptr;
}

}  // namespace datapar::tools
