// A rank's own state beside a checkpoint (what differs between ranks and the checkpoint,
// rank 0's, does not hold: PowerSGD's errors, DiLoCo's inner optimizer state):
// <--checkpoint-dir>/<name>-epoch-<E>-rank-<R>.pt, written whole or not at all.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "datapar/state_dict.h"

namespace datapar::tools {

struct TrainPlan;

void save_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const StateDict& state);

// Reads this rank's state of `epoch` and hands it to `apply`; without one, says so (`what`:
// whose state, `afresh`: what begins afresh) and returns false. A file `apply` or the reader refuses is an
// InvalidArgumentError naming it, with what to do.
bool load_rank_state(const TrainPlan& plan, const std::string& name, int64_t epoch, const std::string& what,
                     const std::string& afresh, const std::function<void(const StateDict&)>& apply);

}  // namespace datapar::tools
