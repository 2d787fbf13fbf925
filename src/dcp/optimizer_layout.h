// What dcp's model and FSDP helpers share about optimizers (module_state.cc).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "datapar/dcp/checkpoint.h"
#include "datapar/optim/optimizer_state.h"

namespace datapar::dcp::detail {

// The module's name of each of `params`; InvalidArgumentError naming `holder` (e.g.
// "dcp::add_optimizer: the optimizer") for one that is not the module's.
std::vector<std::string> names_in(const torch::nn::Module& module, const std::vector<at::Tensor>& params,
                                  const std::string& holder);

// State for every parameter that has none yet, as zeros (PyTorch's get_state_dict does the
// same by a step with zero gradients): what a load fills.
void create_missing_state(torch::optim::Optimizer& optimizer);

// The param-group keys PyTorch 2.15's optimizers have and libtorch's do not, with a Python
// optimizer's defaults (SGD's groups have "momentum"; `adamw`: decoupled_weight_decay).
std::vector<std::pair<std::string, c10::IValue>> python_only_keys(const c10::impl::GenericDict& group, bool adamw);

// "<prefix>.param_groups.<g>.<key>" for each key of each group of `osd` but "params", the
// keys of python_only_keys it lacks, and "params": params_of(g, group), the parameters' names.
void add_param_groups(State& state, const std::string& prefix, const OptimizerState& osd, bool adamw,
                      const std::function<c10::impl::GenericList(int64_t, const c10::impl::GenericDict&)>& params_of);

// `current`'s param groups (an optimizer's state dict) with every "<prefix>.param_groups.<g>.<key>"
// value of a loaded `state` but "params" put in: the hyperparameters a checkpoint restores.
c10::impl::GenericList loaded_param_groups(const State& state, const std::string& prefix,
                                           const OptimizerState& current);

}  // namespace datapar::dcp::detail
