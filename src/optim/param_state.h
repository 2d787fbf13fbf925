// The one table of optimizer kinds datapar knows (SGD, Adam, AdamW): which kind an optimizer
// is (the one dynamic_cast ladder), PyTorch's names of its state, and one parameter's state
// as tensors and a few numbers, for ZeroRedundancyOptimizer's consolidate(),
// its re-sharding after a membership change (2 copies), checkpoints and DCP.
// A new kind is a row here: its enum value and a case in each function.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace datapar::detail {

enum class OptimizerKind { kSgd, kAdam, kAdamW, kOther };

OptimizerKind optimizer_kind(const torch::optim::Optimizer& optimizer);
// "SGD", "Adam", "AdamW", or a phrase for the others (for error messages).
const char* optimizer_kind_name(OptimizerKind kind);

// An optimizer of `kind` over `params` with a copy of `options` (that kind's options, as
// `param_groups()[0].options()` of an optimizer of that kind gives them). Throws
// InvalidArgumentError for kOther.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, std::vector<at::Tensor> params,
                                                        const torch::optim::OptimizerOptions& options);

// PyTorch's names of one parameter's state for an optimizer of `kind` with `options` (the
// keys of torch.optim's state_dict): SGD's "momentum_buffer" (none without momentum); Adam's
// and AdamW's "step", "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad; none for
// kOther. What a rank that owns no state knows alike from the kind and options alone.
std::vector<std::string> param_state_names(OptimizerKind kind, const torch::optim::OptimizerOptions& options);

// One parameter's state as zeros, as PyTorch's get_state_dict makes it (a step with zero
// gradients); nullptr where the kind keeps none (SGD without momentum, kOther).
std::unique_ptr<torch::optim::OptimizerParamState> zero_param_state(OptimizerKind kind, const at::Tensor& param,
                                                                    const torch::optim::OptimizerOptions& options);

// [has state, Adam's step count, has amsgrad's maximum] of one parameter's state (null: none).
using ParamStateMeta = std::array<int64_t, 3>;
ParamStateMeta param_state_meta(OptimizerKind kind, const torch::optim::OptimizerParamState* state);

// The state's tensors in a fixed order (undefined ones left out): SGD's momentum buffer;
// Adam's exp_avg, exp_avg_sq and max_exp_avg_sq.
std::vector<at::Tensor> param_state_tensors(OptimizerKind kind, const torch::optim::OptimizerParamState& state);
// How many tensors a state with `meta` has.
size_t param_state_tensor_count(OptimizerKind kind, const ParamStateMeta& meta);

// The state made of `tensors` (as param_state_tensors orders them) and `meta`.
std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(OptimizerKind kind, const ParamStateMeta& meta,
                                                                    const std::vector<at::Tensor>& tensors);
// A deep copy: shares no tensor with `state`.
std::unique_ptr<torch::optim::OptimizerParamState> copy_param_state(OptimizerKind kind,
                                                                    const torch::optim::OptimizerParamState& state);

// Zeroes the gradients of `params` in place, as libtorch 1.x's Optimizer::zero_grad:
// gradients that are views of DDP's buckets (gradient_as_bucket_view) stay views.
void zero_gradients_in_place(const std::vector<at::Tensor>& params);

// ZeRO's owners of `params` over `world` ranks: by size, largest first, each to the rank
// that owns the fewest elements so far (ties: the lowest rank). The same on every rank.
std::vector<int> balanced_owners(const std::vector<at::Tensor>& params, int world);

}  // namespace datapar::detail
