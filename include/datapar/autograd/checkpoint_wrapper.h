// Activation checkpointing applied to a model's blocks, as PyTorch's
// apply_activation_checkpointing(model, check_fn) with its CheckpointWrapper: each block's
// forward runs without keeping its activations and is recomputed in backward
// (datapar::checkpoint, checkpoint.h).
//
//   models::ResNet18 model;
//   datapar::checkpoint_each<models::ResidualImpl>(*model);       // every residual block
//   datapar::fully_shard_each<datapar::CheckpointedImpl<models::ResidualImpl>>(*model, group);
//
// The blocks are found in the model's Sequentials (wrap_each.h) and keep their parameter
// names. A block's forward takes one tensor and returns one.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>

#include "datapar/autograd/checkpoint.h"
#include "datapar/nn/wrap_each.h"

namespace datapar {

template <typename M>
class CheckpointedImpl : public detail::WrapperModule {
 public:
  explicit CheckpointedImpl(std::shared_ptr<M> module, CheckpointOptions options = {})
      : WrapperModule(module, "datapar::Checkpointed"), module_(std::move(module)), options_(options) {}

  at::Tensor forward(const at::Tensor& input) {
    return checkpoint([this](const at::Tensor& x) { return module_->forward(x); }, input, options_);
  }

  const std::shared_ptr<M>& module() const { return module_; }

 private:
  std::shared_ptr<M> module_;
  CheckpointOptions options_;
};

// Wraps each element of type Units (Impl types) of every Sequential in `root`'s tree in a
// CheckpointedImpl, in place. Returns how many.
template <typename... Units>
int checkpoint_each(torch::nn::Module& root, CheckpointOptions options = {}) {
  return detail::wrap_each<Units...>(root, [&](auto module) {
    using Unit = typename decltype(module)::element_type;
    return std::make_shared<CheckpointedImpl<Unit>>(std::move(module), options);
  });
}

}  // namespace datapar
