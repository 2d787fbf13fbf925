// The small model and data of the FSDP and HSDP tests (and of tests/fsdp/torch_hsdp_twin.py,
// which builds the same in Python): two Linear layers in a Sequential (units under
// fully_shard_each) and a head called directly (the root's own): 220 + 420 + 105
// parameters, none a multiple of 3 ranks; rank r's batch at a step, 3 + r rows (uneven); and
// d2l's ResNet-18 with its images.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cstdint>
#include <mutex>

#include "datapar/models/resnet18.h"

namespace datapar::testing {

struct FsdpNetImpl : torch::nn::Module {
  FsdpNetImpl()
      : blocks(register_module("blocks", torch::nn::Sequential(torch::nn::Linear(10, 20), torch::nn::ReLU(),
                                                               torch::nn::Linear(20, 20), torch::nn::Tanh()))),
        head(register_module("head", torch::nn::Linear(20, 5))) {}
  at::Tensor forward(const at::Tensor& x) { return head->forward(blocks->forward(x)); }
  torch::nn::Sequential blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(FsdpNet);

// The default generator is not thread-safe, and constructing a module draws from it: ranks
// that are threads make their models under this lock.
inline std::mutex& generator_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The model initialised from `seed`, in `dtype`.
inline FsdpNet fsdp_net(uint64_t seed, at::ScalarType dtype = at::kDouble) {
  const std::lock_guard<std::mutex> lock(generator_mutex());
  torch::manual_seed(seed);
  FsdpNet model;
  model->to(dtype);
  return model;
}

// Rank r's batch at `step`: 3 + r rows, computed in float64, then in `dtype`.
inline at::Tensor fsdp_batch(int r, int step, at::ScalarType dtype = at::kDouble) {
  return at::sin(at::arange(10 * (3 + r), at::kDouble).view({3 + r, 10}) * (0.1 * (r + 1)) + step).to(dtype);
}

// d2l's ResNet-18 for one-channel 12 x 12 images, initialised from `seed`, in float64.
inline models::ResNet18 fsdp_resnet18(uint64_t seed) {
  const std::lock_guard<std::mutex> lock(generator_mutex());
  torch::manual_seed(seed);
  models::ResNet18 model(10, 1);
  model->to(at::kDouble);
  return model;
}

// Rank r's two images at `step` for it.
inline at::Tensor fsdp_images(int r, int step) {
  return at::sin(at::arange(2 * 144, at::kDouble).view({2, 1, 12, 12}) * (0.3 + r) + step);
}

}  // namespace datapar::testing
