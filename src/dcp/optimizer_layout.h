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
#include "datapar/train/optimizer_state.h"

namespace datapar::dcp::detail {

// State for every parameter that has none yet, as zeros (PyTorch's get_state_dict does the
// same by a step with zero gradients): what a load fills.
void create_missing_state(torch::optim::Optimizer& optimizer);

// The param-group keys PyTorch 2.15's optimizers have and libtorch's do not, with a Python
// optimizer's defaults (SGD's groups have "momentum"; `adamw`: decoupled_weight_decay).
std::vector<std::pair<std::string, c10::IValue>> python_only_keys(const c10::impl::GenericDict& group, bool adamw);

// "<prefix>.param_groups.<g>.<key>" for each key of each group of `osd` but "params", the
// keys of python_only_keys it lacks, and "params": params_of(g, group), the parameters' names.
void add_param_groups(State& state, const std::string& prefix, const train::OptimizerState& osd, bool adamw,
                      const std::function<c10::impl::GenericList(int64_t, const c10::impl::GenericDict&)>& params_of);

}  // namespace datapar::dcp::detail
