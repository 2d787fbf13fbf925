// The checkpoint every mode writes (--checkpoint-dir, --checkpoint-format): the same file
// (torch) or directory (dcp) whatever the mode, so that any checkpoint resumes in any mode.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

#include "../train.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/train/checkpoint.h"

namespace datapar::tools {

// Writes `c` (the model and optimizer state, whole; its epoch set) as the checkpoint of
// c.epoch. torch: rank 0 writes one file, atomically. dcp: every rank writes its share
// (collective over the default group), under --zero its own shard of `zero`'s state, in the
// names a whole optimizer has.
void write_checkpoint(const TrainPlan& plan, const torch::nn::Module& model, train::Checkpoint c,
                      ZeroRedundancyOptimizer* zero = nullptr);

}  // namespace datapar::tools
