// torch.amp.GradScaler for C++: float16's range ends at 65504 and its smallest normal is 6e-5,
// so small gradients of a float16 forward (datapar::amp::Autocast with at::kHalf) vanish.
// The scaler multiplies the loss by a large factor before backward, divides the gradients by
// it before the optimizer steps, skips any step whose gradients hold an inf or a NaN (and
// halves the factor), and doubles the factor after `growth_interval` steps without one.
// The same defaults and the same state_dict() keys as PyTorch's.
//
//   datapar::amp::GradScaler scaler;
//   for (...) {
//     optimizer.zero_grad();
//     at::Tensor loss;
//     {
//       datapar::amp::Autocast autocast(c10::DeviceType::CUDA, at::kHalf);
//       loss = at::cross_entropy_loss(model->forward(x).to(at::kFloat), y);
//     }
//     scaler.scale(loss).backward();
//     scaler.unscale(optimizer);               // optional: before clipping the gradients
//     scaler.step(optimizer);                  // skipped when a gradient is not finite
//     scaler.update();
//   }
//
// With an optimizer that holds a shard of the parameters (ZeroRedundancyOptimizer's shard,
// FSDP's), each rank sees only its gradients: give the scaler the group, and every rank skips
// the steps any rank found an overflow in (as PyTorch's ShardedGradScaler). Under DDP the
// gradients are the same on every rank already; no group is needed.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: scale() and unscale() pass through, step() steps
  // The ranks whose optimizers hold shards of one model: an overflow on any skips the step
  // on all. Collective: every rank of it calls unscale() (or step()) for the same optimizers.
  std::shared_ptr<ProcessGroup> group;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss x the scale (on the loss's device). Throws InvalidArgumentError for a loss that is
  // not floating point.
  at::Tensor scale(const at::Tensor& loss) const;
  // Divides the gradients of `optimizer`'s parameters by the scale, in place, and notes
  // whether any is inf or NaN (over the group, if any); returns whether all were finite (the
  // step may go ahead). Once per optimizer between update()s: a second call throws
  // InvalidArgumentError; so do float16 gradients (keep the parameters float32: autocast
  // computes in float16, the optimizer steps in float32) and sparse ones.
  bool unscale(torch::optim::Optimizer& optimizer);
  // Unscales if not done yet; steps `optimizer` unless a gradient was not finite. Returns
  // whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // The scale for the next iteration: backoff_factor x after a step with an overflow (in any
  // optimizer unscaled since the last update), growth_factor x after growth_interval steps
  // without; forgets which optimizers were unscaled.
  void update();

  // For a caller that agrees on overflows itself (fault-tolerant training, whose members
  // unscale the gradients they keep and agree over each membership, src/ft/step_protocol.cc):
  // divides `gradients` (undefined ones skipped) by the scale in place and returns whether
  // all are finite, without the group and without noting anything; update(found_inf) then
  // takes the agreed verdict. The same checks as unscale(optimizer).
  bool unscale_gradients(const std::vector<at::Tensor>& gradients) const;
  // update() with the caller's verdict: whether the iteration found an overflow.
  void update(bool found_inf);

  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  // Steps without an overflow since the scale last changed (PyTorch's _growth_tracker).
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker
  // (empty when disabled, as PyTorch's). load_state_dict throws InvalidArgumentError for a
  // dict without them, or with a scale that is not positive and finite.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  std::map<const torch::optim::Optimizer*, bool> found_inf_;  // unscaled since update(): found an overflow?
};

}  // namespace datapar::amp
