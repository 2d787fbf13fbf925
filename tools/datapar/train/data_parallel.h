// --mode dp: DataParallel over --devices in this process (each batch split over them, by
// measured speed under --balance auto), the optimizer whole.
#pragma once

#include <cstdio>

#include "datapar/parallel/data_parallel.h"
#include "report.h"
#include "single_device.h"

namespace datapar::tools {

template <typename Impl>
class DataParallelMode : public SingleDevice<Impl> {
 public:
  // Built after the restore: the replicas start from the restored parameters.
  DataParallelMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer)
      : SingleDevice<Impl>(plan, model, optimizer) {
    const TrainOptions& o = plan.options;
    DataParallelOptions options;
    options.devices = plan.devices;
    options.replicas = o.replicas == "copy" ? ReplicaStorage::kCopy : ReplicaStorage::kShared;
    options.auto_balance = o.balance == "auto";
    options.device_weights = plan.balance_weights;
    dp_ = std::make_unique<DataParallel<Impl>>(std::move(model), options);
  }

  at::Tensor forward(const at::Tensor& x) override { return dp_->forward(x); }

  // The balancer measured at this step's forward: say when it moved the split.
  void after_step(int64_t step) override {
    if (!dp_->balancer() || dp_->balancer()->rebalances() == rebalances_) return;
    rebalances_ = dp_->balancer()->rebalances();
    if (this->plan_.rank == 0) report_balance("device", step, dp_->last_chunk_sizes(), *dp_->balancer());
  }

 private:
  std::unique_ptr<DataParallel<Impl>> dp_;
  int64_t rebalances_ = 0;
};

}  // namespace datapar::tools
