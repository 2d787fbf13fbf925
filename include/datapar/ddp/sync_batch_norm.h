// SyncBatchNorm: batch normalisation whose batch statistics cover every rank's batch, for
// DDP training where each rank's batch alone is too small for good statistics.
//
// Parameters and buffers are BatchNorm's (weight, bias, running_mean, running_var,
// num_batches_tracked), so state dicts move to and from PyTorch's BatchNorm1d/2d/3d and
// SyncBatchNorm. Input (N, C, ...) of any rank >= 2.
//
// Until it has a process group (convert_sync_batchnorm, or the options), or in eval mode,
// it is plain BatchNorm. In training with a group, forward all-reduces the per-channel
// sums (one collective), and backward all-reduces the gradient sums (one more), so every
// rank must run it the same number of times in the same order.
//
// Why a module of its own: libtorch modules hold their children in typed fields, so no
// function can swap a torch::nn::BatchNorm2d for another module after construction. Build
// models with SyncBatchNorm where BatchNorm would go; it costs nothing until converted.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "datapar/process_group/process_group.h"

namespace datapar {

struct SyncBatchNormOptions {
  SyncBatchNormOptions(int64_t num_features) : num_features(num_features) {}  // NOLINT: implicit, like torch's
  int64_t num_features;
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
  std::shared_ptr<ProcessGroup> process_group;  // null: local statistics (plain BatchNorm)
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& input);

  void set_process_group(std::shared_ptr<ProcessGroup> group) { options.process_group = std::move(group); }

  SyncBatchNormOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(SyncBatchNorm);

// Makes every SyncBatchNorm inside `module` synchronise over `group` (default: the default
// group). Throws InvalidArgumentError naming any torch::nn::BatchNorm1d/2d/3d it finds,
// which cannot be converted in place (see above). Returns the number converted.
int convert_sync_batchnorm(torch::nn::Module& module, std::shared_ptr<ProcessGroup> group = nullptr);

}  // namespace datapar
