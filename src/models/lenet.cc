#include "datapar/models/lenet.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

namespace datapar::models {

void LeNetImpl::reset() {
  namespace nn = torch::nn;
  // One push_back per layer, not one nn::Sequential(a, b, ...) call: the order in which a
  // call's arguments are evaluated is unspecified (GCC goes right to left), and each layer
  // draws its initial values from the generator as it is built. Built in order, the layers
  // draw exactly as Python's d2l LeNet does after the same manual_seed.
  layers_ = nn::Sequential();
  layers_->push_back(nn::Conv2d(nn::Conv2dOptions(1, 6, 5).padding(2)));  // (B, 6, 28, 28)
  layers_->push_back(nn::Sigmoid());
  layers_->push_back(nn::AvgPool2d(nn::AvgPool2dOptions(2).stride(2)));  // (B, 6, 14, 14)
  layers_->push_back(nn::Conv2d(nn::Conv2dOptions(6, 16, 5)));            // (B, 16, 10, 10)
  layers_->push_back(nn::Sigmoid());
  layers_->push_back(nn::AvgPool2d(nn::AvgPool2dOptions(2).stride(2)));  // (B, 16, 5, 5)
  layers_->push_back(nn::Flatten());                                      // (B, 400)
  layers_->push_back(nn::Linear(400, 120));
  layers_->push_back(nn::Sigmoid());
  layers_->push_back(nn::Linear(120, 84));
  layers_->push_back(nn::Sigmoid());
  layers_->push_back(nn::Linear(84, 10));
  register_module("net", layers_);
}

at::Tensor LeNetImpl::forward(const at::Tensor& x) { return layers_->forward(x); }

}  // namespace datapar::models
