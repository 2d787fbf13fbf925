#include "datapar/models/lenet.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

namespace datapar::models {

void LeNetImpl::reset() {
  namespace nn = torch::nn;
  layers_ = nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(1, 6, 5).padding(2)), nn::Sigmoid(),  // (B, 6, 28, 28)
      nn::AvgPool2d(nn::AvgPool2dOptions(2).stride(2)),                   // (B, 6, 14, 14)
      nn::Conv2d(nn::Conv2dOptions(6, 16, 5)), nn::Sigmoid(),             // (B, 16, 10, 10)
      nn::AvgPool2d(nn::AvgPool2dOptions(2).stride(2)),                   // (B, 16, 5, 5)
      nn::Flatten(),                                                      // (B, 400)
      nn::Linear(400, 120), nn::Sigmoid(), nn::Linear(120, 84), nn::Sigmoid(), nn::Linear(84, 10));
  register_module("net", layers_);
}

at::Tensor LeNetImpl::forward(const at::Tensor& x) { return layers_->forward(x); }

}  // namespace datapar::models
