// A rank's own state beside a checkpoint (what differs between ranks and the checkpoint,
// rank 0's, does not hold: PowerSGD's errors, DiLoCo's inner optimizer state):
// <--checkpoint-dir>/<name>-epoch-<E>-rank-<R>.pt, written whole or not at all.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "datapar/amp/grad_scaler.h"
#include "datapar/state_dict.h"

namespace datapar::tools {

struct TrainPlan;

// `rank`: whose file; -1, this rank's (plan.rank). State the same on every rank (fault-tolerant
// training's gradient scaler) is rank 0's file, whoever writes or reads it.
void save_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const StateDict& state,
                     int rank = -1);

// Reads this rank's state of `epoch` and hands it to `apply`; without one, says so (`what`:
// whose state, `afresh`: what begins afresh) and returns false. A file `apply` or the reader refuses is an
// InvalidArgumentError naming it, with what to do.
bool load_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const std::string& what,
                     const std::string& afresh, const std::function<void(const StateDict&)>& apply, int rank = -1);

// --amp fp16: the gradient scaler's scale and growth count beside the checkpoint of `epoch`
// epochs ("grad-scaler"), and back on resume; `rank` as above.
void save_scaler_state(const TrainPlan& plan, const amp::GradScaler& scaler, int64_t epoch, int rank = -1);
void load_scaler_state(const TrainPlan& plan, amp::GradScaler& scaler, int64_t epoch, int rank = -1);

}  // namespace datapar::tools
