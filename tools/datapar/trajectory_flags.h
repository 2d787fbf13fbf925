// The flags that decide what a training computes: every member of a fault-tolerant job must
// train one trajectory, or a recovery mixes two (issue 46: another --batch-size hung both
// nodes, another --seed trained to exit 0 with a model 2.5e-1 off).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "datapar/rendezvous/store.h"
#include "train.h"

namespace datapar::tools {

// ("--flag", value) for each such flag of `plan`; `train_samples`: the training set's size
// (the data directory may differ between hosts, its contents may not).
std::vector<std::pair<std::string, std::string>> trajectory_flags(const TrainPlan& plan, int64_t train_samples);

// The first member to call it publishes its flags under `key` of the job's store; any other
// whose flags differ throws InvalidArgumentError naming each flag that differs, with both
// values. Throws what the store throws.
void check_same_trajectory(Store& store, const std::string& key,
                           const std::vector<std::pair<std::string, std::string>>& flags);

}  // namespace datapar::tools
