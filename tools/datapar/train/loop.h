// The training loop of every mode but the fault-tolerant one: per epoch, train (next batch,
// forward, backward, step), evaluate exactly over the ranks, checkpoint, and report (rank 0).
// The sampler shuffles by seed + epoch, the same on every rank and in every mode, so a
// resumed run reads exactly the batches the uninterrupted one would have.
#pragma once

#include <cstdint>

#include "../train.h"
#include "data.h"
#include "strategy.h"

namespace datapar::tools {

// Trains epochs first_epoch + 1 .. --epochs with `strategy`. Returns the exit code.
int train_epochs(const TrainPlan& plan, const Data& data, Strategy& strategy, int64_t first_epoch);

// --evaluate: rank 0 prints the test accuracy of the checkpoint of `epoch` epochs, which
// `strategy`'s model holds.
int evaluate_checkpoint(const TrainPlan& plan, const Data& data, Strategy& strategy, int64_t epoch);

}  // namespace datapar::tools
