#include "datapar/models/resnet18.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <string>

#include "datapar/error.h"

namespace datapar::models {

ResidualImpl::ResidualImpl(int64_t in_channels, int64_t out_channels, bool use_1x1conv, int64_t stride)
    : in_channels_(in_channels), out_channels_(out_channels), use_1x1conv_(use_1x1conv), stride_(stride) {
  DATAPAR_CHECK(in_channels >= 1 && out_channels >= 1 && stride >= 1, "Residual: channels ", in_channels, " -> ",
                out_channels, " with stride ", stride, "; all must be positive.");
  DATAPAR_CHECK(use_1x1conv || (in_channels == out_channels && stride == 1), "Residual: ", in_channels, " -> ",
                out_channels, " channels with stride ", stride,
                " changes the shape, so the identity shortcut cannot be added; pass use_1x1conv = true.");
  reset();
}

void ResidualImpl::reset() {
  namespace nn = torch::nn;
  // Registration order is d2l's (conv1, conv2, conv3, bn1, bn2): state dicts list the
  // keys in that order in both languages.
  conv1_ = register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(in_channels_, out_channels_, 3).padding(1).stride(stride_)));
  conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out_channels_, out_channels_, 3).padding(1)));
  if (use_1x1conv_) {
    conv3_ = register_module("conv3", nn::Conv2d(nn::Conv2dOptions(in_channels_, out_channels_, 1).stride(stride_)));
  }
  bn1_ = register_module("bn1", nn::BatchNorm2d(out_channels_));
  bn2_ = register_module("bn2", nn::BatchNorm2d(out_channels_));
}

at::Tensor ResidualImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::relu(bn1_->forward(conv1_->forward(x)));
  y = bn2_->forward(conv2_->forward(y));
  return at::relu(y + (conv3_ ? conv3_->forward(x) : x));
}

ResNet18Impl::ResNet18Impl(int64_t num_classes, int64_t in_channels)
    : num_classes_(num_classes), in_channels_(in_channels) {
  DATAPAR_CHECK(num_classes >= 1 && in_channels >= 1, "ResNet18: num_classes ", num_classes, " and in_channels ",
                in_channels, " must be positive.");
  reset();
}

void ResNet18Impl::reset() {
  namespace nn = torch::nn;
  // "0" and "1" are the indices d2l's nn.Sequential gives the stem conv and BatchNorm (its
  // ReLU, "2", has no parameters and is applied in forward).
  stem_conv_ = register_module("0", nn::Conv2d(nn::Conv2dOptions(in_channels_, 64, 3).stride(1).padding(1)));
  stem_bn_ = register_module("1", nn::BatchNorm2d(64));
  const int64_t channels[5] = {64, 64, 128, 256, 512};
  for (int s = 0; s < 4; ++s) {
    const int64_t in = channels[s];
    const int64_t out = channels[s + 1];
    const bool downsample = s > 0;  // d2l: every stage but the first (first_block=True)
    // Two statements, not nn::Sequential(Residual(...), Residual(...)): the blocks draw their
    // initial values in order only if they are built in order (argument order is unspecified).
    stages_[s] = nn::Sequential();
    stages_[s]->push_back(Residual(in, out, downsample, downsample ? 2 : 1));
    stages_[s]->push_back(Residual(out, out));
    register_module("resnet_block" + std::to_string(s + 1), stages_[s]);
  }
  // d2l's global_avg_pool (nn.AdaptiveAvgPool2d) has no parameters: forward does the pool.
  fc_ = register_module("fc", nn::Sequential(nn::Flatten(), nn::Linear(512, num_classes_)));
}

at::Tensor ResNet18Impl::forward(const at::Tensor& x) {
  at::Tensor y = at::relu(stem_bn_->forward(stem_conv_->forward(x)));  // (B, 64, H, W)
  for (auto& stage : stages_) y = stage->forward(y);                    // (B, 512, H/8, W/8)
  return fc_->forward(at::adaptive_avg_pool2d(y, {1, 1}));              // (B, num_classes)
}

}  // namespace datapar::models
