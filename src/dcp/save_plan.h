// dcp::save in two halves, for dcp::AsyncSaver (async_save.cc): the plan, agreed by every
// rank in the caller's thread, then the write, in the background, which reads only what
// this rank writes. So an asynchronous save stages this rank's share of the replicated
// tensors, not all of them (half at two ranks; before, every rank staged the whole state).
#pragma once

#include <memory>
#include <string>

#include "datapar/dcp/checkpoint.h"

namespace datapar {
class ProcessGroup;
}

namespace datapar::dcp::detail {

struct SavePlan;  // checkpoint.cc

// What a saver keeps of its last plan (Note [A plan remembered] in checkpoint.cc): this
// rank's layout, encoded, and the plan agreed for it.
struct PlanMemo {
  std::string layout;
  std::shared_ptr<const SavePlan> plan;
};

// Every rank's plan, exchanged and checked, and who writes each whole tensor and value.
// Throws what dcp::save throws before it writes: a directory it cannot use (on every rank),
// ranks whose states differ. `group` null: one process. With `memo` (every rank's, or no
// rank's), a save of the layout the last one had reuses its plan.
std::shared_ptr<const SavePlan> plan_save(const State& state, const std::string& dir, ProcessGroup* group,
                                          PlanMemo* memo = nullptr);

// Whether this rank writes entry `i` of the planned state: its shards, or the whole tensor
// or value the plan gave it.
bool writes_entry(const SavePlan& plan, size_t i);

// The rest of dcp::save: this rank's data file, everyone's byte ranges, rank 0's .metadata.
// `state` has the planned entries; only those writes_entry names are read.
void write_planned(const State& state, const SavePlan& plan, ProcessGroup* group);

}  // namespace datapar::dcp::detail
