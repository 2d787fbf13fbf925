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

}  // namespace datapar
