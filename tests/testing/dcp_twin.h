// The model, loss and optimizer step of tests/dcp/dcp_interop.py, for the C++ side of the
// DCP tests: Sequential(Linear(6, 8), ReLU, Linear(8, 3)) (parameters 0.weight, 0.bias,
// 2.weight, 2.bias, as PyTorch's), loss out.pow(2).mean().
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <mutex>

namespace datapar::testing {

// Ranks as threads make their models at once; the default generator is not thread-safe.
inline torch::nn::Sequential dcp_twin(int seed) {
  static std::mutex generator;
  const std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

inline void dcp_twin_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& x) {
  optimizer.zero_grad();
  model->forward(x).pow(2).mean().backward();
  optimizer.step();
}

}  // namespace datapar::testing
