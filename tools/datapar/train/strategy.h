// A mode of `datapar train` as the training loop sees it (one file per mode beside this one,
// made by make_strategy.h): the forward of the wrapped model, the optimizer's zero_grad and
// step, the checkpoint it writes, and the model itself. The loop (loop.h) knows nothing else
// of a mode, so a new mode is a new strategy and a line in make_strategy.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>

#include "datapar/amp/grad_scaler.h"
#include "datapar/ddp/communication_stats.h"
#include "datapar/process_group/process_group.h"

namespace datapar::tools {

class Strategy {
 public:
  virtual ~Strategy() = default;

  // Logits (B, 10) in float32 for a batch on the training device.
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  virtual void zero_grad() = 0;
  virtual void step() = 0;
  // Collective where the mode is: writes the checkpoint of `epoch` epochs done, in
  // --checkpoint-format's form, one that resumes in any mode (checkpoint_writer.h).
  virtual void save_checkpoint(int64_t epoch) = 0;
  // The model, unwrapped: train() and eval() go to it.
  virtual torch::nn::Module& module() = 0;

  // ddp --balance auto: the group whose ranks the balancer measures, and the communication
  // the mode measured so far (RankBalancer); nullptr in the other modes.
  virtual std::shared_ptr<ProcessGroup> balanced_group() const { return nullptr; }
  virtual CommunicationStats communication_stats() const { return {}; }
  // After step `step` of the run (dp: says when its device balancer moved the split).
  virtual void after_step(int64_t step) {}
  // Resumed from the checkpoint of `epoch` epochs: the mode's own state beside it (ddp
  // --comm-hook powersgd: each rank's errors and warm-start matrices).
  virtual void resumed(int64_t epoch) {}
  // After an epoch's last step, before its evaluation and checkpoint (ddp --sync-every: the
  // ranks' models become one).
  virtual void end_of_epoch() {}

  // --amp fp16: the ranks whose optimizers step different gradients (each a shard: ZeRO,
  // FSDP), which must skip a step together when any finds an overflow; nullptr where every
  // rank's optimizer sees the same gradients, or each rank's skip is its own (DiLoCo's
  // replicas).
  virtual std::shared_ptr<ProcessGroup> sharded_gradients_group() const { return nullptr; }
  // --cuda-graph: the optimizer step() steps, whole on this process (single, ddp); nullptr in
  // the modes a graph does not take.
  virtual torch::optim::Optimizer* whole_optimizer() { return nullptr; }
  // The loop's gradient scaler, which step() then goes through.
  void use_grad_scaler(amp::GradScaler* scaler) { scaler_ = scaler; }

 protected:
  // Steps `optimizer`; under --amp fp16 through the scaler (unscaled first, skipped when a
  // gradient is inf or NaN).
  void step_optimizer(torch::optim::Optimizer& optimizer) {
    if (scaler_ != nullptr) {
      scaler_->step(optimizer);
    } else {
      optimizer.step();
    }
  }

  amp::GradScaler* scaler_ = nullptr;
};

}  // namespace datapar::tools
