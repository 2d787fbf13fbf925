// --mode fsdp: FullyShardedDataParallel, one rank per process, each holding a shard of every
// unit's parameters, gradients and optimizer state; --mp computes in bf16 or fp16. --mode hsdp: the
// same over the shard groups of a hybrid layout, replicated across them.
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "datapar/autograd/checkpoint_wrapper.h"
#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/fsdp/hybrid_groups.h"
#include "datapar/models/resnet18.h"
#include "datapar/optim/optimizer_state.h"
#include "datapar/train/fsdp_checkpoint.h"
#include "single_device.h"

namespace datapar::tools {

// The units of fully sharded training, in both the fsdp mode and the fault-tolerant one:
// each layer with parameters in the models' Sequentials (a residual block whole); the rest
// (resnet18's stem) is the root's.
template <typename Impl>
void shard_units(Impl& model, const std::shared_ptr<ProcessGroup>& group, const FsdpOptions& options) {
  fully_shard_each<torch::nn::LinearImpl, torch::nn::Conv2dImpl, models::ResidualImpl,
                   CheckpointedImpl<models::ResidualImpl>>(model, group, options);
}

// FSDP's options of the run (--no-reshard, --mp), the loss averaged by samples.
inline FsdpOptions fsdp_options(const TrainOptions& o) {
  FsdpOptions options;
  options.reshard_after_forward = o.reshard;
  options.average_by_samples = true;
  if (o.mp != "none") {
    options.param_dtype = o.mp == "bf16" ? at::kBFloat16 : at::kHalf;
    options.buffer_dtype = options.param_dtype;  // BatchNorm computes in one dtype on the CPU
  }
  return options;
}

template <typename Impl>
class FsdpMode : public Strategy {
 public:
  // `optimizer`: the restored optimizer over the whole model; the optimizer over the shards takes its
  // part of its state, which then goes. Over the default group, or (hsdp) `hybrid`'s.
  FsdpMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer,
           const HybridGroups& hybrid = {})
      : plan_(plan), model_(model) {
    shard_group_ = hybrid.shard ? hybrid.shard : default_group();
    FsdpOptions options = fsdp_options(plan.options);
    options.replicate_group = hybrid.replicate;
    const OptimizerState restored = optimizer_state_dict(optimizer);
    shard_units(*model, hybrid.shard, options);
    fsdp_ = std::make_unique<FullyShardedDataParallel<Impl>>(std::move(model), hybrid.shard, options);
    shards_ = optimizer_like(optimizer)(fsdp_->parameters());
    fsdp_->load_full_optimizer_state(*shards_, restored);
    optimizer.state().clear();
  }

  at::Tensor forward(const at::Tensor& x) override { return fsdp_->forward(x).to(at::kFloat); }  // the loss in float32
  void zero_grad() override { shards_->zero_grad(); }
  void step() override { step_optimizer(*shards_); }
  std::shared_ptr<ProcessGroup> sharded_gradients_group() const override { return shard_group_; }
  // The whole model and state, gathered on every rank: the checkpoint single-device training writes.
  void save_checkpoint(int64_t epoch) override { write_checkpoint(plan_, *model_, train::make_checkpoint(*fsdp_, *shards_, epoch)); }
  torch::nn::Module& module() override { return *model_; }

  // What the optimizer steps on this rank (its shards), and the optimizer (DiLoCoMode
  // averages them across the replica groups).
  std::vector<at::Tensor> trained_parameters() const { return fsdp_->parameters(); }
  torch::optim::Optimizer& inner_optimizer() { return *shards_; }

 protected:
  const TrainPlan& plan_;
  std::shared_ptr<Impl> model_;
  std::unique_ptr<FullyShardedDataParallel<Impl>> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> shards_;
  std::shared_ptr<ProcessGroup> shard_group_;  // the ranks whose shards make one model
};

}  // namespace datapar::tools
