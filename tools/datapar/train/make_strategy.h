// The strategy of the run's --mode (strategy.h): one line per mode.
#pragma once

#include <memory>

#include "data_parallel.h"
#include "ddp.h"
#include "fsdp.h"
#include "single_device.h"

namespace datapar::tools {

// Wraps `model` (restored already) and `sgd` for plan.mode.
template <typename Impl>
std::unique_ptr<Strategy> make_strategy(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd) {
  switch (plan.mode) {
    case Mode::kSingle: return std::make_unique<SingleDevice<Impl>>(plan, std::move(model), sgd);
    case Mode::kDataParallel: return std::make_unique<DataParallelMode<Impl>>(plan, std::move(model), sgd);
    case Mode::kDdp: return std::make_unique<DdpMode<Impl>>(plan, std::move(model), sgd);
    case Mode::kFsdp: return std::make_unique<FsdpMode<Impl>>(plan, std::move(model), sgd);
  }
  return nullptr;
}

}  // namespace datapar::tools
