// Resuming together (issue 27): before a job trains on from checkpoints, its ranks agree on
// what they resume. A rank that found another checkpoint, or none (a node-local checkpoint
// directory another node lacks, a restart where one directory was emptied), would train
// out of step with the others while rank 0 wrote "good" checkpoints of the mix.
//
//   auto last = train::load_latest_checkpoint(dir, rank, device);
//   train::agree_on_resume(*default_group(), last.checkpoint);  // every rank; throws on all if they differ
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "datapar/process_group/process_group.h"
#include "datapar/train/checkpoint.h"

namespace datapar::train {

// What a rank resumes from: the epoch and the digest of the checkpoint's records
// (Checkpoint::digest; 0 and 0 for none).
struct ResumePoint {
  int64_t epoch = 0;
  uint32_t digest = 0;
};

// The point of `checkpoint`, as load_checkpoint or load_latest_checkpoint gave it.
ResumePoint resume_point(const std::optional<Checkpoint>& checkpoint);

// Collective over `group` (every rank calls it once, before training): throws
// CheckpointError on every rank, naming each rank's epoch and digest, unless all ranks
// resume the same point. Returns that point.
ResumePoint agree_on_resume(ProcessGroup& group, const std::optional<Checkpoint>& checkpoint);

}  // namespace datapar::train
