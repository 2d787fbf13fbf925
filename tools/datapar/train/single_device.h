// --mode single: the model itself on one device, and its optimizer. The base of the modes whose
// optimizer is whole on every process (dp, and ddp without --zero).
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>

#include "checkpoint_writer.h"
#include "datapar/optim/optimizer_factory.h"
#include "strategy.h"

namespace datapar::tools {

template <typename Impl>
class SingleDevice : public Strategy {
 public:
  SingleDevice(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer)
      : plan_(plan), model_(std::move(model)), optimizer_(optimizer) {}

  at::Tensor forward(const at::Tensor& x) override { return model_->forward(x); }
  void zero_grad() override { optimizer_.zero_grad(); }
  void step() override { step_optimizer(optimizer_); }
  // Every process holds the same parameters and state: rank 0 writes for all (torch), or
  // each its share (dcp).
  void save_checkpoint(int64_t epoch) override {
    write_checkpoint(plan_, *model_, train::make_checkpoint(*model_, optimizer_, epoch));
  }
  torch::nn::Module& module() override { return *model_; }

  // What the optimizer steps on this rank, and the optimizer (DiLoCoMode averages them).
  std::vector<at::Tensor> trained_parameters() const { return model_->parameters(); }
  torch::optim::Optimizer& inner_optimizer() { return optimizer_; }
  torch::optim::Optimizer* whole_optimizer() override { return &optimizer_; }

 protected:
  const TrainPlan& plan_;
  std::shared_ptr<Impl> model_;
  torch::optim::Optimizer& optimizer_;
};

}  // namespace datapar::tools
