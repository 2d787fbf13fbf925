// An optimizer's state in the layout of PyTorch's optimizer.state_dict(), so that Python's
// torch.optim can load what datapar saves and datapar can load what Python saves:
//
//   {"state": {0: {"momentum_buffer": Tensor}, 1: {...}, ...},          SGD
//             {0: {"step": Tensor(), "exp_avg": T, "exp_avg_sq": T}}    Adam, AdamW
//    "param_groups": [{"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0,
//                      "nesterov": false, "maximize": false, "params": [0, 1, 2, 3]}, ...]}
//
// Parameters are numbered 0, 1, ... across the groups in order, as Python does; a parameter
// without state (no step taken yet, or momentum 0) has no entry in "state". libtorch's own
// torch::save(optimizer) writes another, C++-only layout; this is not that.
//
// Supported: torch::optim::SGD (momentum, dampening, weight decay, nesterov), Adam and AdamW
// (betas, eps, weight decay, amsgrad). Others throw InvalidArgumentError.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

namespace datapar {

// A dict with str keys at the top ("state", "param_groups"), as PyTorch's.
using OptimizerState = c10::Dict<c10::IValue, c10::IValue>;

// The state of `optimizer` now. Tensors are the optimizer's own (no copy): save or clone
// them before the next step(). Throws InvalidArgumentError for an unsupported optimizer.
OptimizerState optimizer_state_dict(const torch::optim::Optimizer& optimizer);

// Replaces the optimizer's per-parameter state and each group's hyperparameters with
// `state`, from optimizer_state_dict() here or Python's optimizer.state_dict(). The
// optimizer must hold the same parameters in the same groups as the one saved (what is
// checked: group count, parameters per group, each state tensor's shape). State tensors
// are copied onto each parameter's device and, if floating point, its dtype. Keys this
// optimizer does not use (Python's "foreach", "differentiable", "initial_lr") are ignored;
// "maximize": true is refused, since libtorch's optimizers only minimize.
// Throws InvalidArgumentError naming the first mismatch; the optimizer is unchanged then.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const OptimizerState& state);

}  // namespace datapar
