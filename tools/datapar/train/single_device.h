// --mode single: the model itself on one device, and its SGD. The base of the modes whose
// optimizer is whole on every process (dp, and ddp without --zero).
#pragma once

#include <torch/optim/sgd.h>

#include <memory>

#include "checkpoint_writer.h"
#include "datapar/optim/optimizer_factory.h"
#include "strategy.h"

namespace datapar::tools {

// Makes SGDs with the options of `sgd` over other parameters (ZeRO's shards, FSDP's).
inline OptimizerFactory sgd_like(const torch::optim::SGD& sgd) {
  const auto options = static_cast<const torch::optim::SGDOptions&>(sgd.defaults());
  return [options](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(std::move(params), options);
  };
}

template <typename Impl>
class SingleDevice : public Strategy {
 public:
  SingleDevice(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::SGD& sgd)
      : plan_(plan), model_(std::move(model)), sgd_(sgd) {}

  at::Tensor forward(const at::Tensor& x) override { return model_->forward(x); }
  void zero_grad() override { sgd_.zero_grad(); }
  void step() override { sgd_.step(); }
  // Every process holds the same parameters and state: rank 0 writes for all (torch), or
  // each its share (dcp).
  void save_checkpoint(int64_t epoch) override {
    write_checkpoint(plan_, *model_, train::make_checkpoint(*model_, sgd_, epoch));
  }
  torch::nn::Module& module() override { return *model_; }

  // What the optimizer steps on this rank, and the optimizer (DiLoCoMode averages them).
  std::vector<at::Tensor> trained_parameters() const { return model_->parameters(); }
  torch::optim::SGD& inner_sgd() { return sgd_; }

 protected:
  const TrainPlan& plan_;
  std::shared_ptr<Impl> model_;
  torch::optim::SGD& sgd_;
};

}  // namespace datapar::tools
