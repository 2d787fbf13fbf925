// --optimizer, --lr, --momentum, --weight-decay and --amp: what steps the model and in which
// precision its forward runs.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace datapar::tools {

struct TrainPlan;
struct TrainOptions;

// Their checks, before the job starts (InvalidArgumentError).
void check_optimizer_flags(const TrainOptions& o);

// --lr, or the optimizer's default: 0.1 for sgd (d2l's), 1e-3 for adam and adamw (torch.optim's).
double learning_rate(const TrainOptions& o);
// --weight-decay, or the optimizer's default: 0, and 0.01 for adamw (torch.optim.AdamW's).
double weight_decay(const TrainOptions& o);

// The run's optimizer over `params` (--lr after --scale-lr): every optimizer a mode makes
// (ZeRO's, FSDP's shards', DiLoCo's inner ones) is made like it (optimizer_like).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainPlan& plan, std::vector<at::Tensor> params);

}  // namespace datapar::tools
