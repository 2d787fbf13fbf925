// d2l's LeNet-5 for 1x28x28 images: two 5x5 convolutions with sigmoid and 2x2 average
// pooling, then three Linear layers (400-120-84-10) with sigmoid between them.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>

namespace datapar::models {

class LeNetImpl : public torch::nn::Cloneable<LeNetImpl> {
 public:
  LeNetImpl() { reset(); }

  void reset() override;

  // x: (B, 1, 28, 28) -> logits (B, 10).
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Sequential layers_{nullptr};
};
TORCH_MODULE(LeNet);

}  // namespace datapar::models
