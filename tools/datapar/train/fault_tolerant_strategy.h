// A mode under --fault-tolerant (docs/fault_tolerance.md) as the fault-tolerant loop
// (fault_tolerant_loop.h) sees it: the library's fault-tolerant layer (ft::FaultTolerantDdp,
// ft::FaultTolerantFsdp: the step protocol) around the mode's model and optimizer, built
// from the same parts as the mode's strategy (strategy.h). One file per mode beside this one,
// made by make_strategy.h.
//
// It is not a Strategy: its zero_grad and optimizer step belong to the step protocol, which
// runs them inside train_step and applies an update only when every member voted to commit.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "datapar/amp/grad_scaler.h"
#include "datapar/error.h"
#include "datapar/ft/slice_gradients.h"
#include "datapar/ft/step_protocol.h"
#include "datapar/train/checkpoint.h"

namespace datapar::tools {

class FaultTolerantStrategy {
 public:
  virtual ~FaultTolerantStrategy() = default;

  // The steps committed so far (the step the next train_step trains), and the membership
  // epochs joined (1 in a run without failures or newcomers).
  virtual int64_t committed_steps() const = 0;
  virtual int64_t memberships_joined() const = 0;
  // The global batch the slice being trained belongs to: committed_steps() but while a
  // strategy trains several steps in one train_step (a DiLoCo round's inner steps).
  virtual int64_t training_step() const { return committed_steps(); }

  // Forward and backward of one fixed slice of the step's global batch (ft/slice_gradients.h)
  // through forward(); returns its rows. A shadow slice is trained but not counted.
  using TrainSlice = std::function<int64_t(const ft::Slice& slice)>;
  // Trains step committed_steps() (ft::FaultTolerantDdp::train_step): true when committed;
  // if not, the step is trained again over the new membership at the next call.
  virtual bool train_step(const TrainSlice& train, const ft::BetweenSteps& before) = 0;
  // After the last step (ft::FaultTolerantDdp::finish).
  virtual void finish(const ft::BetweenSteps& last) = 0;

  // The current membership epoch's model: logits (B, 10) for a batch, and the module for
  // train() and eval().
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  virtual torch::nn::Module& module() = 0;
  // Collective over the membership: the checkpoint of `epoch` epochs, in PyTorch's layout,
  // on the membership's rank 0 (nullopt on the others).
  virtual std::optional<train::Checkpoint> checkpoint(int64_t epoch) = 0;

  // --amp fp16: the loop's scaler, given before the first step (StepProtocol::use_grad_scaler).
  virtual void use_grad_scaler(amp::GradScaler* scaler) {
    DATAPAR_CHECK(scaler == nullptr, "datapar train: this fault-tolerant mode takes no gradient scaler.");
  }
};

}  // namespace datapar::tools
