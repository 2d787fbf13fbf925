// A multilayer perceptron for 28x28 images: flatten, then Linear/ReLU layers.
// The default 784-512-512-10 is the MLP of the benchmarks.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace datapar::models {

class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  // sizes: input features, hidden widths..., classes.
  explicit MlpImpl(std::vector<int64_t> sizes = {784, 512, 512, 10});

  void reset() override;

  // x: (B, ...) with prod(...) == sizes.front() -> logits (B, sizes.back()).
  at::Tensor forward(const at::Tensor& x);

 private:
  std::vector<int64_t> sizes_;
  torch::nn::Sequential layers_{nullptr};
};
TORCH_MODULE(Mlp);

}  // namespace datapar::models
