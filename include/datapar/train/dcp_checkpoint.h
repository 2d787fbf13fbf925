// Training checkpoints (checkpoint.h) in PyTorch's torch.distributed.checkpoint format
// (datapar/dcp/checkpoint.h): a directory per checkpoint, "<dir>/epoch-<N>", that every rank
// writes its share of, and that Python loads with dcp.load. `datapar train
// --checkpoint-format dcp` keeps its checkpoints so.
//
// Entries, in the names of PyTorch's get_state_dict: "model.<name>", "optim.state.<param>.<key>",
// "optim.param_groups.<i>.<key>", and "epoch", "progress.<key>", "rng.cpu", "rng.cuda.<i>".
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "datapar/dcp/checkpoint.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/process_group/process_group.h"
#include "datapar/train/checkpoint.h"

namespace datapar::train {

// "<dir>/epoch-<N>".
std::string dcp_checkpoint_path(const std::string& dir, int64_t epoch);

// Writes `checkpoint` (of `module`, whose parameters number its optimizer state) into `path`.
// Collective over `group` (null: this process alone); every rank holds the same checkpoint.
// `zero`: the optimizer state is ZeRO-1's, each rank's shard written by that rank under the
// whole optimizer's names (dcp::add_zero_optimizer), in place of checkpoint.optimizer.
void save_dcp_checkpoint(const Checkpoint& checkpoint, const torch::nn::Module& module, const std::string& path,
                         ProcessGroup* group, ZeroRedundancyOptimizer* zero = nullptr);

// The DCP state save_dcp_checkpoint writes: the checkpoint's tensors as they are (no copy).
dcp::State dcp_checkpoint_state(const Checkpoint& checkpoint, const torch::nn::Module& module,
                                ZeroRedundancyOptimizer* zero = nullptr);

// A directory load_latest_dcp_checkpoint passed over, and why.
struct SkippedCheckpoint {
  std::string path;
  std::string problem;  // what dcp::checkpoint_problem says
};

// Loads the newest complete "epoch-<N>" of `dir` (the same N on every rank: the smallest
// newest one among them), as a Checkpoint for restore_checkpoint. Newer directories without
// a complete checkpoint (a save cut short, a damaged or hostile .metadata) are skipped and
// listed in `skipped` with the reason. nullopt if none. Collective over `group` (null: alone).
std::optional<Checkpoint> load_latest_dcp_checkpoint(const std::string& dir, const torch::nn::Module& module,
                                                     ProcessGroup* group, std::vector<SkippedCheckpoint>* skipped);

// Renames the checkpoint directory `path` to <path>.damaged (or .damaged.1, ...: the first
// name not taken), so that a run that writes its epoch again is not refused; returns the new
// name. Throws CheckpointError, with `problem`, when it cannot.
std::string move_dcp_checkpoint_aside(const std::string& path, const std::string& problem);

}  // namespace datapar::train
