#include "datapar/models/mlp.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include "datapar/error.h"

namespace datapar::models {

MlpImpl::MlpImpl(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {
  DATAPAR_CHECK(sizes_.size() >= 2, "Mlp: give at least input and output sizes.");
  reset();
}

void MlpImpl::reset() {
  layers_ = torch::nn::Sequential();
  for (size_t i = 0; i + 1 < sizes_.size(); ++i) {
    layers_->push_back(torch::nn::Linear(sizes_[i], sizes_[i + 1]));
    if (i + 2 < sizes_.size()) layers_->push_back(torch::nn::ReLU());
  }
  register_module("layers", layers_);
}

at::Tensor MlpImpl::forward(const at::Tensor& x) { return layers_->forward(x.flatten(1)); }

}  // namespace datapar::models
