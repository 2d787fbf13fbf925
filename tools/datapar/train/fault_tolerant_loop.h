// The training loop of --fault-tolerant (datapar/ft/fault_tolerant_ddp.h,
// docs/fault_tolerance.md): step g is global batch g of the run (BalancedBatches's order of
// its epoch, cut into the job's full size of slices), trained by the ranks alive at that
// moment and committed only when every one of them finished it, so the training does not
// depend on who is alive. At each epoch's end the ranks alive evaluate a part of the test set
// each (and, under --zero, gather the optimizer state on the first); the first reports and
// writes the checkpoint.
#pragma once

#include <cstdint>

#include "../train.h"
#include "data.h"
#include "datapar/data/balanced_batches.h"
#include "datapar/ft/elastic_group.h"
#include "fault_tolerant_strategy.h"

namespace datapar::tools {

// Trains from the step `strategy` holds to the end of --epochs; `batches` cuts the run's
// epochs into global batches; `first_epoch` epochs were done before (a resumed run).
// Returns the exit code (0 too when this member came after the training ended).
int train_fault_tolerant(const TrainPlan& plan, const Data& data, FaultTolerantStrategy& strategy, ft::ElasticGroup& elastic,
                         BalancedBatches& batches, int64_t first_epoch);

}  // namespace datapar::tools
