// FullyShardedDataParallel: each rank keeps 1/N of the module's parameters, their gradients
// and (through the optimizer it gives them to) their optimizer state, as ZeRO-3 and
// PyTorch's FSDP do. The parameters are gathered whole for forward and again for backward;
// the gradients are reduce-scattered, averaged over the ranks, into the shards.
//
//   datapar::FullyShardedDataParallel fsdp(model, group);   // every rank, same model
//   torch::optim::SGD sgd(fsdp.parameters(), 0.1);          // the shards
//   for (...) { sgd.zero_grad(); loss(fsdp.forward(x), y).backward(); sgd.step(); }
//
// This first form makes the whole module one unit: between steps each rank holds 1/N of the
// parameters, gradients and optimizer state; during forward and backward the whole
// parameters exist once more (FsdpOptions::reshard_after_forward frees them in between).
// Units per submodule, gathered one at a time, are issue 29's next step.
//
// - The module's own parameters stay its own tensors (its layers keep using them): at
//   construction each becomes a view of one flat buffer per module, which is filled by an
//   all-gather before it is used and emptied after (Note [Parameters over a flat buffer] in
//   fully_sharded_data_parallel.cc); the optimizer steps the shards, not them. Between
//   steps they hold no memory: the module's own forward, called outside this one's, throws
//   (libtorch: "its data is not allocated").
// - Starts every rank from rank 0's parameters. Gradients are the average over the ranks,
//   as DDP's: one backward per forward; a gradient of the module's parameters reaches the
//   shards at the end of backward.
// - Requires every trainable parameter to have one floating dtype.
// - Not thread-safe: one forward/backward at a time.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar {

struct FsdpOptions {
  // Free the gathered parameters after forward and gather them again for backward (ZeRO-3);
  // false: keep them until the end of backward (less communication, more memory).
  bool reshard_after_forward = true;
};

namespace detail {

// The non-template part of FullyShardedDataParallel.
class FsdpCore {
 public:
  FsdpCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group, FsdpOptions options);
  ~FsdpCore();
  FsdpCore(const FsdpCore&) = delete;
  FsdpCore& operator=(const FsdpCore&) = delete;

  void pre_forward();
  // `outputs`: what the module's forward returned (tensors, nested in lists, tuples, dicts).
  void post_forward(const c10::IValue& outputs);
  std::vector<at::Tensor> parameters() const { return {shard_}; }
  int64_t shard_numel() const { return shard_.numel(); }
  int64_t padded_numel() const { return padded_; }
  bool gathered() const;

 private:
  void gather();
  void reshard();
  void pre_backward();
  void post_backward();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  FsdpOptions options_;
  std::vector<at::Tensor> params_;  // the module's trainable parameters, views of full_
  at::Tensor full_;                 // the flat unsharded buffer; its storage is empty when resharded
  at::Tensor shard_;                // this rank's part of it: what the optimizer steps
  int64_t numel_ = 0;               // of the parameters
  int64_t padded_ = 0;              // numel_ rounded up to a multiple of the group's size
  bool gathered_for_backward_ = false;
};

}  // namespace detail

template <typename ModuleImpl>
class FullyShardedDataParallel {
 public:
  // group: the ranks to shard over (default: datapar::default_group()).
  FullyShardedDataParallel(std::shared_ptr<ModuleImpl> module, std::shared_ptr<ProcessGroup> group = nullptr,
                           FsdpOptions options = {})
      : module_(std::move(module)),
        core_(std::make_shared<detail::FsdpCore>(module_, std::move(group), options)) {}

  FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module,
                           std::shared_ptr<ProcessGroup> group = nullptr, FsdpOptions options = {})
      : FullyShardedDataParallel(module.ptr(), std::move(group), options) {}

  // Runs the module's forward with its parameters gathered.
  template <typename... Args>
  auto forward(Args&&... args) {
    core_->pre_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    core_->post_forward(c10::IValue(output));  // the same tensors: hooks set on them are the caller's
    return output;
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // This rank's shard of the parameters (one flat tensor): give it to the optimizer.
  std::vector<at::Tensor> parameters() const { return core_->parameters(); }
  // Whether the whole parameters are gathered now (between forward and the end of backward
  // without resharding, or inside forward).
  bool gathered() const { return core_->gathered(); }
  int64_t shard_numel() const { return core_->shard_numel(); }
  std::shared_ptr<ModuleImpl> module() const { return module_; }

 private:
  std::shared_ptr<ModuleImpl> module_;
  std::shared_ptr<detail::FsdpCore> core_;
};

template <typename ModuleImpl>
FullyShardedDataParallel(std::shared_ptr<ModuleImpl>) -> FullyShardedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
FullyShardedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>)
    -> FullyShardedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
FullyShardedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>, FsdpOptions)
    -> FullyShardedDataParallel<ModuleImpl>;

}  // namespace datapar
