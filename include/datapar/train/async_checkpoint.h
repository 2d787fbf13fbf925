// Training checkpoints written in the background (`datapar train --checkpoint-async`), in
// either format: the step that saves pays for copying the state into host memory (reused
// from one save to the next; pinned for CUDA tensors), and a thread of the writer's own
// writes, fsyncs and renames it while training goes on. C++ has no GIL: the write really
// runs beside the training.
//
//   train::AsyncCheckpointWriter writer;                      // torch format
//   for (int64_t epoch = first; epoch < epochs; ++epoch) {
//     ... train, calling writer.check() now and then: a failed write is reported there ...
//     writer.save(train::make_checkpoint(*model, optimizer, epoch + 1),
//                 train::checkpoint_path(dir, epoch + 1), rank);
//   }
//   writer.wait();  // the last one written, or its failure thrown: never lost
//
// One write is in flight at a time: a save while the previous is still being written waits
// for it, and warns. The writes are atomic as save_checkpoint's and dcp::save's are: a process
// killed during one leaves the checkpoints before it whole, and the partial one is never
// taken by load_latest_checkpoint / load_latest_dcp_checkpoint.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/process_group/process_group.h"
#include "datapar/train/checkpoint.h"

namespace datapar::train {

class AsyncCheckpointWriter {
 public:
  // `dcp_group`: for save_dcp, the ranks that save together, used by this writer only (make
  // it with new_group over the job's ranks: its exchanges run on the writer's thread);
  // nullptr: save_dcp saves this process alone. save() needs no group.
  explicit AsyncCheckpointWriter(std::shared_ptr<ProcessGroup> dcp_group = nullptr);
  ~AsyncCheckpointWriter();  // waits for the write in flight; warns of a failure never reported

  // As save_checkpoint(checkpoint, path, rank), in the background: rank 0 stages the
  // checkpoint and returns; other ranks do nothing. Throws the failure (CheckpointError) of
  // an earlier write not yet reported, before staging anything.
  void save(const Checkpoint& checkpoint, const std::string& path, int64_t rank);
  // As save_dcp_checkpoint(checkpoint, module, path, group, zero), in the background; every
  // rank of the group calls it.
  void save_dcp(const Checkpoint& checkpoint, const torch::nn::Module& module, const std::string& path,
                ZeroRedundancyOptimizer* zero = nullptr);
  // Throws the failure of a write that has ended and was not reported yet; never waits.
  void check();
  // Waits for the write in flight, then check().
  void wait();
  bool in_flight() const;
  // Seconds the last save blocked its caller (waiting for the previous write, and staging).
  double last_blocked_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace datapar::train
