// BalancedBatches: an epoch's batches when ranks of unlike speed take unlike shares of each
// global batch (`datapar train --mode ddp --balance auto`).
//
// Every rank draws the same epoch order: DistributedSampler's with one rank, i.e. PyTorch's
// randperm from seed + epoch (or 0..n-1 without shuffle). Step s takes positions
// [s B, (s+1) B) of it, the global batch, and splits them over the ranks with
// weighted_chunk_sizes(rows, weights): rank r reads the r-th piece. So every sample is read
// exactly once per epoch, by one rank, with no padding; and the ranks' batches of a step
// together are that global batch, so DDP's average_by_samples gives exactly its gradient.
//
// A last global batch with fewer rows than there are ranks joins the one before it: every
// rank has rows in every step (a rank without rows would have no loss to average).
// The weights may change between steps (a re-balance): batches(first_step, weights) gives
// the rest of the epoch under the new ones, and every rank must use the same weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace datapar {

struct BalancedBatchesOptions {
  int64_t dataset_size = 0;  // REQUIRES: >= world_size
  int64_t global_batch = 0;  // rows per step over all ranks. REQUIRES: >= world_size
  int64_t world_size = 1;    // REQUIRES: >= 1
  int64_t rank = 0;          // REQUIRES: 0 <= rank < world_size
  bool shuffle = true;
  uint64_t seed = 0;         // the same on every rank
};

class BalancedBatches {
 public:
  // Throws InvalidArgumentError for options outside the REQUIRES above.
  explicit BalancedBatches(BalancedBatchesOptions options);

  // Chooses the epoch's order (seed + epoch). REQUIRES: epoch >= 0.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // Steps in an epoch (the same on every rank).
  int64_t num_steps() const;
  // Rows of the global batch of step s, and each rank's share of them under `weights`
  // (one per rank, >= 0, some > 0). REQUIRES: 0 <= step < num_steps().
  int64_t global_rows(int64_t step) const;
  std::vector<int64_t> rank_rows(int64_t step, const std::vector<double>& weights) const;

  // This rank's batches ((rows,) int64 dataset indices) for steps [first_step, num_steps())
  // under `weights`. REQUIRES: 0 <= first_step <= num_steps().
  std::vector<at::Tensor> batches(int64_t first_step, const std::vector<double>& weights) const;
  // Every row of global batch `step` of this epoch, in order: what the ranks' shares of it
  // put together (for a job that cuts each batch itself, e.g. over the ranks alive).
  at::Tensor global_batch(int64_t step) const;

  const BalancedBatchesOptions& options() const { return options_; }

 private:
  BalancedBatchesOptions options_;
  int64_t epoch_ = 0;
  at::Tensor order_;  // the epoch's order, shared by every rank
};

}  // namespace datapar
