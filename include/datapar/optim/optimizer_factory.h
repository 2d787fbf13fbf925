// OptimizerFactory: builds the optimizer of a set of parameters. What ZeRO, FSDP and fault
// tolerance take instead of an optimizer, since each builds one over the parameters (or
// shards) a rank keeps, and again when those change: the same kind and hyperparameters on
// every rank, one parameter group.
//
//   datapar::OptimizerFactory make_adam = [](std::vector<at::Tensor> params) {
//     return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
//   };
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <vector>

namespace datapar {

using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> params)>;

// Makes optimizers like `optimizer` over other parameters: its kind (torch::optim::SGD, Adam
// or AdamW) with a copy of its first parameter group's options, as they are now.
//
//   torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   datapar::ZeroRedundancyOptimizer zero(model->parameters(), datapar::optimizer_like(adamw));
//
// Throws InvalidArgumentError for another kind (write the factory yourself) or an optimizer
// without a parameter group.
OptimizerFactory optimizer_like(const torch::optim::Optimizer& optimizer);

}  // namespace datapar
