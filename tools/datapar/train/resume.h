// Resuming a run (--resume, a launcher's restart) or loading one for --evaluate: the newest
// checkpoint that loads, in either format, every rank onto its device.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>

#include "../train.h"

namespace datapar::tools {

// Resumes (or, for --evaluate, loads) the newest checkpoint that loads; every rank loads
// onto its device. Note [Damaged checkpoints] (checkpoint.h): rank 0 moves damaged ones
// aside, so that this run, which writes those epochs again, cannot overwrite them
// (--evaluate moves nothing). With none intact, a run that had checkpoints (damaged ones,
// or ones moved aside before) stops unless --start-over, and so does an explicit --resume
// with none at all; only a launcher's restart before the first checkpoint starts from
// epoch 1 by itself. Returns the epochs the checkpoint holds: 0 starts from epoch 1.
int64_t resume(const TrainPlan& plan, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               const c10::Device& device);

}  // namespace datapar::tools
