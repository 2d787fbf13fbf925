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

// The dtype statistics and gradient sums are computed in: float64 for float64 inputs, else
// float32 (float16 sums overflow past 65504, bfloat16 keeps 8 bits of mantissa).
at::ScalarType accumulate_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Note [SyncBatchNorm statistics]
// Each rank centres its values on its own mean c_r, computed in the accumulate type, and
// sums the deviations d = x - c_r and their squares: s_r = sum d, q_r = sum d^2. Never
// E[x^2] - mean^2, which loses every digit of the variance when the mean is large against
// the spread. The ranks all-gather [n_r, c_r, s_r, q_r] in float64, where c_r's own rounding
// is undone exactly: the rank's mean is m_r = c_r + s_r / n_r and its sum of squared
// deviations M2_r = q_r - s_r^2 / n_r. They are combined as Chan et al.'s parallel variance:
//   N = sum n_r, mean = sum n_r m_r / N, M2 = sum (M2_r + n_r (m_r - mean)^2).
// PyTorch's SyncBatchNorm likewise gathers per-rank statistics with counts rather than
// summing raw moments.

// Normalisation with statistics over every rank. The group travels as a pointer in the
// context: the module that owns the group outlives the graph it builds.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::Tensor input, at::Tensor weight, at::Tensor bias,
                               at::Tensor running_mean, at::Tensor running_var, double eps, double momentum,
                               int64_t group_address) {
    auto* group = reinterpret_cast<ProcessGroup*>(group_address);
    const at::Tensor x = input.contiguous();
    const at::ScalarType acc = accumulate_type(x);
    const at::Tensor xa = x.to(acc);
    const int64_t channels = x.size(1);
    const auto dims = reduce_dims(x);
    const auto shape = channel_shape(x);
    // Note [SyncBatchNorm statistics]: this rank's [n, c (C), s (C), q (C)], all-gathered in
    // float64 on the group's device (nccl: this rank's GPU), as every tensor a group moves.
    const double local_count = static_cast<double>(x.numel() / channels);
    at::Tensor centre = xa.mean(dims);
    if (local_count == 0) centre.zero_();  // an empty batch on this rank: nothing to add
    const at::Tensor deviations = xa - centre.view(shape);
    const at::TensorOptions on_group = group->options(at::kDouble);
    const at::Tensor mine = at::cat({at::full({1}, local_count, on_group), centre.to(on_group),
                                     deviations.sum(dims).to(on_group), deviations.square().sum(dims).to(on_group)});
    std::vector<at::Tensor> all;
    for (int r = 0; r < group->size(); ++r) all.push_back(at::empty_like(mine));
    group->all_gather(all, mine)->synchronize();  // the count is read on the host
    const at::Tensor gathered = at::stack(all).to(x.device());  // (world, 1 + 3C)
    const at::Tensor counts = gathered.narrow(1, 0, 1);          // (world, 1)
    const double count = host_doubles(counts.sum().reshape({1})).front();
    DATAPAR_CHECK(count > 1, "SyncBatchNorm: ", count, " value(s) per channel over all ranks; need more than 1.");
    const at::Tensor per_rank = counts.clamp_min(1);
    const at::Tensor sums = gathered.narrow(1, 1 + channels, channels);
    const at::Tensor means = gathered.narrow(1, 1, channels) + sums / per_rank;                   // m_r
    const at::Tensor m2s = gathered.narrow(1, 1 + 2 * channels, channels) - sums.square() / per_rank;  // M2_r
    const at::Tensor mean = (counts * means).sum(0) / count;
    const at::Tensor m2 = (m2s + counts * (means - mean).square()).sum(0).clamp_min(0);
    const at::Tensor var = m2 / count;
    const at::Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((m2 / (count - 1)).to(running_var.scalar_type()), momentum);
    }
    const at::Tensor mean_a = mean.to(acc).view(shape);
    const at::Tensor invstd_a = invstd.to(acc).view(shape);
    at::Tensor out = (xa - mean_a) * invstd_a;
    if (weight.defined()) out = out * weight.to(acc).view(shape) + bias.to(acc).view(shape);
    ctx->save_for_backward({x, weight, mean_a, invstd_a});
    ctx->saved_data["group"] = group_address;
    ctx->saved_data["count"] = count;
    return {out.to(x.scalar_type())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const double count = ctx->saved_data["count"].toDouble();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const at::ScalarType acc = mean.scalar_type();  // accumulate_type(x), as in forward
    const at::Tensor dy = grads[0].contiguous().to(acc);
    const auto dims = reduce_dims(x);
    const auto shape = channel_shape(x);
    const int64_t channels = x.size(1);
    const at::Tensor xhat = (x.to(acc) - mean) * invstd;
    // Local sums for weight and bias (DDP averages those like any gradient); global sums
    // of dy and dy * xhat for the input's gradient through the shared statistics.
    const at::Tensor sum_dy = dy.sum(dims);
    const at::Tensor sum_dy_xhat = (dy * xhat).sum(dims);
    at::Tensor global = at::cat({sum_dy, sum_dy_xhat}).to(group->options(at::kDouble));
    group->all_reduce(global, ReduceOp::kSum)->wait();
    global = global.to(x.device());
    const at::Tensor mean_dy = (global.narrow(0, 0, channels) / count).to(acc).view(shape);
    const at::Tensor mean_dy_xhat = (global.narrow(0, channels, channels) / count).to(acc).view(shape);
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(acc).view(shape);
    const at::Tensor grad_input = ((dy - mean_dy - xhat * mean_dy_xhat) * scale).to(x.scalar_type());
    at::Tensor grad_weight, grad_bias;
    if (weight.defined()) {
      grad_weight = sum_dy_xhat.to(weight.scalar_type());
      grad_bias = sum_dy.to(weight.scalar_type());
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
