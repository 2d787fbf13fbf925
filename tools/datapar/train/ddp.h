// --mode ddp: DistributedDataParallel, one rank per process, each backward averaging the
// gradients by samples (an uneven last batch still gives the exact gradient); the optimizer whole
// on every rank, or under --zero (ZeRO-1) each rank's shard of it.
#pragma once

#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/powersgd_hook.h"
#include <optional>

#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "comm_hook_flag.h"
#include "single_device.h"

namespace datapar::tools {

// ZeRO-1 over `params` (the model's), its shards' optimizers made like `optimizer` and
// starting from its state (what resume() restored, if anything), which then goes: sharded over the
// default group (copies 1), or, with copies 2, over none until the fault-tolerant layer
// shards it over each membership.
inline std::unique_ptr<ZeroRedundancyOptimizer> make_zero(std::vector<at::Tensor> params,
                                                          torch::optim::Optimizer& optimizer, int copies) {
  ZeroOptions options;
  options.copies = copies;
  OptimizerFactory make = optimizer_like(optimizer);
  auto zero = copies == 1 ? std::make_unique<ZeroRedundancyOptimizer>(std::move(params), std::move(make), nullptr, options)
                          : std::make_unique<ZeroRedundancyOptimizer>(std::move(params), std::move(make), options);
  zero->load_full_state(optimizer);
  optimizer.state().clear();
  return zero;
}

// Collective over `zero`'s group: the checkpoint of `model` and the whole state of `zero`,
// gathered on the group's rank 0 (the file single-device training writes); nullopt on the others.
inline std::optional<train::Checkpoint> zero_checkpoint(const torch::nn::Module& model, ZeroRedundancyOptimizer& zero,
                                                        int64_t epoch) {
  const std::unique_ptr<torch::optim::Optimizer> whole = zero.consolidate(0);
  if (!whole) return std::nullopt;
  return train::make_checkpoint(model, *whole, epoch);
}

template <typename Impl>
class DdpMode : public SingleDevice<Impl> {
 public:
  // Built after the restore: DDP's first broadcast starts every rank from the restored
  // parameters, and ZeRO's shards take their state from the restored optimizer, whose own goes.
  DdpMode(const TrainPlan& plan, std::shared_ptr<Impl> model, torch::optim::Optimizer& optimizer)
      : SingleDevice<Impl>(plan, model, optimizer) {
    DdpOptions options;
    // Exact for an uneven last batch; under --cuda-graph every step's batches are of one size
    // (the last partial one is left out), where averaging by world size is the same, and a
    // graph cannot capture the samples' exchange.
    options.average_by_samples = !plan.options.cuda_graph;
    ddp_ = std::make_unique<DistributedDataParallel<Impl>>(std::move(model), nullptr, options);
    if (std::shared_ptr<CommHook> hook = comm_hook_of(plan.options.comm_hook)) {
      ddp_->register_comm_hook(hook);
      powersgd_ = std::dynamic_pointer_cast<PowerSgdHook>(hook);
    }
    if (plan.options.zero) zero_ = make_zero(ddp_->parameters(), optimizer, /*copies=*/1);
  }

  at::Tensor forward(const at::Tensor& x) override { return ddp_->forward(x); }
  std::shared_ptr<ProcessGroup> sharded_gradients_group() const override {
    return zero_ ? default_group() : nullptr;
  }

  void zero_grad() override {
    if (zero_) {
      zero_->zero_grad();
    } else {
      this->optimizer_.zero_grad();
    }
  }

  void step() override {
    if (zero_) {
      // This rank's shard, then every rank's parameters to all; under --amp fp16 every rank
      // skips the step when any shard's gradients overflowed.
      if (this->scaler_ == nullptr || this->scaler_->unscale(*zero_->shard_optimizer())) zero_->step();
    } else {
      this->step_optimizer(this->optimizer_);
    }
  }

  // Under --zero the whole state is gathered on rank 0 first (every rank takes part), so
  // that the file is the one single-device training writes; in the dcp format each rank writes its own
  // shard instead, in the names a whole optimizer has.
  void save_checkpoint(int64_t epoch) override {
    save_mode_checkpoint(epoch);
    if (powersgd_) save_powersgd_state(this->plan_, *powersgd_, epoch);
  }

  void resumed(int64_t epoch) override {
    if (powersgd_) load_powersgd_state(this->plan_, *powersgd_, epoch);
  }

  torch::optim::Optimizer* whole_optimizer() override { return zero_ ? nullptr : &this->optimizer_; }
  std::shared_ptr<ProcessGroup> balanced_group() const override { return ddp_->process_group(); }
  CommunicationStats communication_stats() const override { return ddp_->communication_stats(); }

 private:
  void save_mode_checkpoint(int64_t epoch) {
    if (!zero_) return SingleDevice<Impl>::save_checkpoint(epoch);
    if (this->plan_.options.checkpoint_format == "dcp") {
      return write_checkpoint(this->plan_, *this->model_, train::make_checkpoint(*this->model_, this->optimizer_, epoch),
                              zero_.get());
    }
    std::optional<train::Checkpoint> whole = zero_checkpoint(*this->model_, *zero_, epoch);
    if (whole) write_checkpoint(this->plan_, *this->model_, std::move(*whole));  // rank 0
  }

  std::unique_ptr<DistributedDataParallel<Impl>> ddp_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;
  std::shared_ptr<PowerSgdHook> powersgd_;  // --comm-hook powersgd: its state goes beside the checkpoints
};

}  // namespace datapar::tools
