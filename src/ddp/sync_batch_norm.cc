#include "datapar/ddp/sync_batch_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/process_group/metadata.h"

namespace datapar {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per-channel shape for broadcasting against (N, C, ...).
std::vector<int64_t> channel_shape(const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return shape;
}

// Dimensions to reduce over: all but the channel.
std::vector<int64_t> reduce_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// Normalisation with statistics over every rank. The group travels as a pointer in the
// context: the module that owns the group outlives the graph it builds.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::Tensor input, at::Tensor weight, at::Tensor bias,
                               at::Tensor running_mean, at::Tensor running_var, double eps, double momentum,
                               int64_t group_address) {
    auto* group = reinterpret_cast<ProcessGroup*>(group_address);
    const at::Tensor x = input.contiguous();
    const int64_t channels = x.size(1);
    const auto dims = reduce_dims(x);
    // [sum (C), sum of squares (C), count]: one all-reduce, in double for stable variance.
    // On the group's device (nccl: this rank's GPU), as every tensor a group moves.
    const at::TensorOptions on_group = group->options(at::kDouble);
    at::Tensor stats = at::cat({x.sum(dims).to(on_group), x.pow(2).sum(dims).to(on_group),
                                at::full({1}, static_cast<double>(x.numel() / channels), on_group)});
    group->all_reduce(stats, ReduceOp::kSum)->synchronize();  // the count is read on the host
    const double count = host_doubles(stats.narrow(0, 2 * channels, 1)).front();
    DATAPAR_CHECK(count > 1, "SyncBatchNorm: ", count, " value(s) per channel over all ranks; need more than 1.");
    stats = stats.to(x.device());
    const at::Tensor mean = stats.narrow(0, 0, channels) / count;
    const at::Tensor var = (stats.narrow(0, channels, channels) / count - mean * mean).clamp_min(0);
    const at::Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
    }
    const auto shape = channel_shape(x);
    const at::Tensor mean_x = mean.to(x.scalar_type()).view(shape);
    const at::Tensor invstd_x = invstd.to(x.scalar_type()).view(shape);
    at::Tensor out = (x - mean_x) * invstd_x;
    if (weight.defined()) out = out * weight.view(shape) + bias.view(shape);
    ctx->save_for_backward({x, weight, mean_x, invstd_x});
    ctx->saved_data["group"] = group_address;
    ctx->saved_data["count"] = count;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const double count = ctx->saved_data["count"].toDouble();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const at::Tensor dy = grads[0].contiguous();
    const auto dims = reduce_dims(x);
    const auto shape = channel_shape(x);
    const int64_t channels = x.size(1);
    const at::Tensor xhat = (x - mean) * invstd;
    // Local sums for weight and bias (DDP averages those like any gradient); global sums
    // of dy and dy * xhat for the input's gradient through the shared statistics.
    const at::Tensor sum_dy = dy.sum(dims);
    const at::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    at::Tensor global = at::cat({sum_dy, sum_dy_xhat}).to(group->options(at::kDouble));
    group->all_reduce(global, ReduceOp::kSum)->wait();
    global = global.to(x.device());
    const at::Tensor mean_dy = (global.narrow(0, 0, channels) / count).to(x.scalar_type()).view(shape);
    const at::Tensor mean_dy_xhat = (global.narrow(0, channels, channels) / count).to(x.scalar_type()).view(shape);
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.view(shape);
    const at::Tensor grad_input = (dy - mean_dy - xhat * mean_dy_xhat) * scale;
    at::Tensor grad_weight, grad_bias;
    if (weight.defined()) {
      grad_weight = sum_dy_xhat;
      grad_bias = sum_dy;
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_) : options(std::move(options_)) { reset(); }

void SyncBatchNormImpl::reset() {
  DATAPAR_CHECK(options.num_features > 0, "SyncBatchNorm: num_features must be positive, not ",
                options.num_features, ".");
  if (options.affine) {
    weight = register_parameter("weight", at::ones({options.num_features}));
    bias = register_parameter("bias", at::zeros({options.num_features}));
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", at::zeros({options.num_features}));
    running_var = register_buffer("running_var", at::ones({options.num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
  }
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  DATAPAR_CHECK(input.dim() >= 2 && input.size(1) == options.num_features, "SyncBatchNorm: expected input (N, ",
                options.num_features, ", ...), got ", input.sizes(), ".");
  const bool training = is_training() || !options.track_running_stats;
  if (training && options.track_running_stats) num_batches_tracked.add_(1);
  const bool sync = training && options.process_group && options.process_group->size() > 1;
  if (!sync) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, training, options.momentum, options.eps,
                          /*cudnn_enabled=*/true);
  }
  return SyncBatchNormFunction::apply(input, weight, bias, training ? running_mean : at::Tensor(),
                                      running_var, options.eps, options.momentum,
                                      reinterpret_cast<int64_t>(options.process_group.get()))[0];
}

int convert_sync_batchnorm(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group) {
  std::vector<SyncBatchNormImpl*> found;
  std::string foreign;
  for (const auto& item : module.named_modules()) {
    torch::nn::Module& m = *item.value();
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(&m)) {
      found.push_back(sync);
    } else if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<torch::nn::BatchNorm2dImpl*>(&m) ||
               dynamic_cast<torch::nn::BatchNorm3dImpl*>(&m)) {
      foreign += (foreign.empty() ? "" : ", ") + (item.key().empty() ? std::string("(the module itself)") : item.key());
    }
  }
  DATAPAR_CHECK(foreign.empty(), "convert_sync_batchnorm: ", foreign,
                " are torch::nn::BatchNorm modules, which libtorch cannot replace inside a built module. Build the "
                "model with datapar::SyncBatchNorm in their place (it is plain BatchNorm until converted).");
  if (!group) group = default_group();
  for (SyncBatchNormImpl* sync : found) sync->set_process_group(group);
  return static_cast<int>(found.size());
}

}  // namespace datapar
