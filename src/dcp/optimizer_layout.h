// What dcp's model and FSDP helpers share about optimizers (module_state.cc).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <utility>
#include <vector>

namespace datapar::dcp::detail {

// State for every parameter that has none yet, as zeros (PyTorch's get_state_dict does the
// same by a step with zero gradients): what a load fills.
void create_missing_state(torch::optim::Optimizer& optimizer);

// The param-group keys PyTorch 2.15's optimizers have and libtorch's do not, with a Python
// optimizer's defaults (SGD's groups have "momentum"; `adamw`: decoupled_weight_decay).
std::vector<std::pair<std::string, c10::IValue>> python_only_keys(const c10::impl::GenericDict& group, bool adamw);

}  // namespace datapar::dcp::detail
