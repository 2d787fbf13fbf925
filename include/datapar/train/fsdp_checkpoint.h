// Training checkpoints of a fully sharded model (checkpoint.h), in the same file layout as an
// unsharded run's: the whole model and optimizer state, gathered from the shards, so that a
// resumed FSDP run, an unsharded one or Python reads it.
//
//   auto checkpoint = train::make_checkpoint(fsdp, optimizer, epoch + 1);   // every rank
//   train::save_checkpoint(checkpoint, train::checkpoint_path(dir, epoch + 1), rank);
//   ...
//   train::restore_checkpoint(train::load_checkpoint(path), fsdp, optimizer);  // every rank
//
// `optimizer` is the one over fsdp.parameters() (the shards). Both calls are collective over
// fsdp's group: every rank makes and restores the checkpoint, rank 0 writes it. The module's
// own parameters hold no values between FSDP's forwards, so make_checkpoint(*module, ...)
// refuses a sharded model and names these.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <utility>

#include "datapar/fsdp/fully_sharded_data_parallel.h"
#include "datapar/train/checkpoint.h"

namespace datapar::train {

template <typename Impl>
Checkpoint make_checkpoint(const FullyShardedDataParallel<Impl>& fsdp, const torch::optim::Optimizer& optimizer,
                           int64_t epoch, Progress progress = {}) {
  Checkpoint c;
  c.model = fsdp.full_state_dict();
  c.optimizer = fsdp.full_optimizer_state(optimizer);
  c.epoch = epoch;
  c.progress = std::move(progress);
  c.rng = get_rng_state();
  return c;
}

template <typename Impl>
void restore_checkpoint(const Checkpoint& checkpoint, FullyShardedDataParallel<Impl>& fsdp,
                        torch::optim::Optimizer& optimizer, bool restore_rng = true) {
  fsdp.load_full_state_dict(checkpoint.model);
  fsdp.load_full_optimizer_state(optimizer, checkpoint.optimizer);
  if (restore_rng) set_rng_state(checkpoint.rng);
}

}  // namespace datapar::train
