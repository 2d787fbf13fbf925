// Keeping a module's copies alike across the members of a fault-tolerant job
// (FaultTolerantDdp, FaultTolerantFsdp): its buffers (BatchNorm's running statistics) and
// parameters from one member, and a member's own buffers kept across the slices it trains.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::ft::detail {

// Collective: the module's buffers (e.g. BatchNorm's running statistics) from `root`.
void broadcast_buffers(torch::nn::Module& module, ProcessGroup& group, int root);
// Collective: the module's parameters and buffers from `root`.
void broadcast_parameters(torch::nn::Module& module, ProcessGroup& group, int root);
// The module's buffers' values, and back.
std::vector<at::Tensor> copy_buffers(const torch::nn::Module& module);
void restore_buffers(torch::nn::Module& module, const std::vector<at::Tensor>& values);

}  // namespace datapar::ft::detail
