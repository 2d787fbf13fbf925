// DistributedSampler: which dataset indices each rank reads in an epoch, as PyTorch's
// torch.utils.data.DistributedSampler decides them, plus exact evaluation and resume.
//
// Every rank builds the same epoch list: a permutation of [0, dataset_size) drawn from
// seed + epoch (torch.randperm with a torch.Generator seeded so: the same list as
// PyTorch's), or 0..n-1 unshuffled; padded by repeating its head until its length divides
// by world_size (or cut to that length with drop_last). Rank r takes positions
// r, r + world_size, r + 2 world_size, ... so all ranks get num_samples() indices and
// the same number of batches (a rank with fewer would hang the others in a collective).
//
// Exact evaluation: padding repeats samples, which would count them twice in metrics.
// is_padding(i) / padding_mask() mark the repeated positions, so a metric that skips them
// counts every sample exactly once across ranks while every rank still runs the same
// number of batches. DistributedSamplerOptions::evaluation() gives the usual settings.
//
// Resume: the sampler keeps a position (samples of this rank's list already consumed;
// DataLoader advances it as batches reach the training loop). state() / load_state() save
// and restore it, and remaining() is then exactly the rest of the interrupted epoch.
//
// Not thread-safe: one thread (the training loop, or DataLoader on its behalf) uses it.
// It does not read data: it only produces indices (see data/loader.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace datapar {

struct DistributedSamplerOptions {
  // Number of samples in the dataset (len(dataset)). REQUIRES: >= 0.
  int64_t dataset_size = 0;
  // Number of ranks sharing the dataset (PyTorch's num_replicas). REQUIRES: >= 1.
  int64_t world_size = 1;
  // This process's rank. REQUIRES: 0 <= rank < world_size.
  int64_t rank = 0;
  // Shuffle with a permutation drawn from seed + epoch (the same on every rank).
  bool shuffle = true;
  // Base seed; must be the same on every rank.
  uint64_t seed = 0;
  // Cut the tail instead of padding: every index at most once, but some samples unseen.
  bool drop_last = false;

  // Settings for exact evaluation: no shuffle, no drop; skip is_padding() positions.
  static DistributedSamplerOptions evaluation(int64_t dataset_size, int64_t world_size, int64_t rank) {
    DistributedSamplerOptions options;
    options.dataset_size = dataset_size;
    options.world_size = world_size;
    options.rank = rank;
    options.shuffle = false;
    return options;
  }
};

// Where a sampler stands, for checkpoints. dataset_size and world_size are recorded so
// that a checkpoint is not silently resumed with another dataset or job size.
struct SamplerState {
  int64_t epoch = 0;
  uint64_t seed = 0;
  int64_t consumed = 0;  // samples of this rank's epoch list already used
  int64_t dataset_size = 0;
  int64_t world_size = 1;
};

class DistributedSampler {
 public:
  // Throws InvalidArgumentError for options outside the REQUIRES above.
  explicit DistributedSampler(DistributedSamplerOptions options);

  // Chooses the epoch's permutation (call it before each epoch, as in PyTorch, or every
  // epoch sees the same order) and rewinds the position to 0. REQUIRES: epoch >= 0.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // Indices this rank reads per epoch, padding included (PyTorch's len(sampler)).
  int64_t num_samples() const { return num_samples_; }
  // num_samples() * world_size: the length of the padded (or cut) epoch list.
  int64_t total_size() const { return num_samples_ * options_.world_size; }
  // This rank's indices that are not padding. Summed over ranks: dataset_size without
  // drop_last, total_size() with it.
  int64_t num_real_samples() const;

  // This rank's whole epoch list, (num_samples(),) int64: PyTorch's list(iter(sampler)).
  at::Tensor indices() const;
  // The part not yet consumed: indices()[position() :].
  at::Tensor remaining() const;

  // Whether position i of this rank's list repeats a sample that another position of the
  // epoch already covers (wrap padding). REQUIRES: 0 <= i < num_samples().
  bool is_padding(int64_t i) const;
  // is_padding for positions [begin, end) as a (end - begin,) bool tensor.
  at::Tensor padding_mask(int64_t begin, int64_t end) const;
  at::Tensor padding_mask() const { return padding_mask(0, num_samples_); }

  // Samples of this epoch already consumed; advance() moves it on (DataLoader calls it
  // when a batch reaches the consumer). REQUIRES: position() + n <= num_samples().
  int64_t position() const { return position_; }
  void advance(int64_t n);

  // Save / restore the epoch, seed and position. load_state throws InvalidArgumentError
  // when the state was saved with another dataset size or world size, or is out of range.
  SamplerState state() const;
  void load_state(const SamplerState& state);

  const DistributedSamplerOptions& options() const { return options_; }

 private:
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
};

}  // namespace datapar
