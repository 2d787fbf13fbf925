// d2l's ResNet-18 for Fashion-MNIST (Dive into Deep Learning, "Concise Implementation for
// Multiple GPUs": resnet18(num_classes, in_channels=1)), a smaller cousin of torchvision's:
//   stem   3x3 conv, 64 channels, stride 1, padding 1 (with bias) + BatchNorm2d + ReLU,
//          and no max-pool (28x28 inputs are small already)
//   stages 4 x 2 Residual blocks, 64 / 128 / 256 / 512 channels; the first block of stages
//          2-4 halves the resolution (stride 2) and takes a 1x1 conv shortcut
//   head   global average pool, Linear(512, num_classes)
// (B, in_channels, H, W) -> (B, num_classes); 28x28 inputs reach 4x4 before the pool.
//
// State-dict names are d2l's, so checkpoints move between this module, d2l's Python
// resnet18 and python/datapar_models.py: "0.weight" and "1.*" for the stem conv and
// BatchNorm (d2l builds an nn.Sequential, whose children are numbered), then
// "resnet_block1.0.conv1.weight" ... "resnet_block4.1.bn2.running_var", "fc.1.weight".
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

namespace datapar::models {

// d2l's Residual: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), where the shortcut
// is x itself or, with use_1x1conv, a 1x1 conv (with bias, no BatchNorm) of the given
// stride. Submodules conv1, conv2, conv3 (only with use_1x1conv), bn1, bn2, in d2l's order.
class ResidualImpl : public torch::nn::Cloneable<ResidualImpl> {
 public:
  ResidualImpl(int64_t in_channels, int64_t out_channels, bool use_1x1conv = false, int64_t stride = 1);

  void reset() override;

  // x: (B, in_channels, H, W) -> (B, out_channels, H / stride, W / stride).
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t in_channels_;
  int64_t out_channels_;
  bool use_1x1conv_;
  int64_t stride_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
};
TORCH_MODULE(Residual);

class ResNet18Impl : public torch::nn::Cloneable<ResNet18Impl> {
 public:
  explicit ResNet18Impl(int64_t num_classes = 10, int64_t in_channels = 1);

  void reset() override;

  // x: (B, in_channels, H, W) -> logits (B, num_classes).
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t num_classes_;
  int64_t in_channels_;
  torch::nn::Conv2d stem_conv_{nullptr};
  torch::nn::BatchNorm2d stem_bn_{nullptr};
  torch::nn::Sequential stages_[4] = {nullptr, nullptr, nullptr, nullptr};
  torch::nn::Sequential fc_{nullptr};  // Flatten, Linear: d2l's "fc"
};
TORCH_MODULE(ResNet18);

}  // namespace datapar::models
