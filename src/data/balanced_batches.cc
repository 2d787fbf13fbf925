#include "datapar/data/balanced_batches.h"

#include <ATen/ATen.h>

#include "datapar/data/distributed_sampler.h"
#include "datapar/error.h"
#include "datapar/parallel/chunk_sizes.h"

namespace datapar {

BalancedBatches::BalancedBatches(BalancedBatchesOptions options) : options_(options) {
  DATAPAR_CHECK(options_.world_size >= 1, "BalancedBatches: world_size is ", options_.world_size,
                "; it must be at least 1.");
  DATAPAR_CHECK(options_.rank >= 0 && options_.rank < options_.world_size, "BalancedBatches: rank ", options_.rank,
                " is outside [0, ", options_.world_size, ").");
  DATAPAR_CHECK(options_.global_batch >= options_.world_size, "BalancedBatches: a global batch of ",
                options_.global_batch, " rows cannot give each of ", options_.world_size,
                " ranks a row; use a batch of at least ", options_.world_size, ".");
  DATAPAR_CHECK(options_.dataset_size >= options_.world_size, "BalancedBatches: ", options_.dataset_size,
                " samples cannot give each of ", options_.world_size, " ranks a row; use fewer ranks or more data.");
  set_epoch(0);
}

void BalancedBatches::set_epoch(int64_t epoch) {
  DATAPAR_CHECK(epoch >= 0, "BalancedBatches::set_epoch: epoch is ", epoch, "; epochs count from 0.");
  epoch_ = epoch;
  // One rank's list with no padding (world 1 pads nothing) is the epoch's order.
  DistributedSamplerOptions order;
  order.dataset_size = options_.dataset_size;
  order.shuffle = options_.shuffle;
  order.seed = options_.seed;
  DistributedSampler sampler(order);
  sampler.set_epoch(epoch);
  order_ = sampler.indices();
}

int64_t BalancedBatches::num_steps() const {
  const int64_t n = options_.dataset_size;
  const int64_t b = options_.global_batch;
  const int64_t steps = (n + b - 1) / b;
  const int64_t last = n - (steps - 1) * b;
  return steps > 1 && last < options_.world_size ? steps - 1 : steps;  // a tiny last batch joins the one before
}

int64_t BalancedBatches::global_rows(int64_t step) const {
  const int64_t steps = num_steps();
  DATAPAR_CHECK(step >= 0 && step < steps, "BalancedBatches: step ", step, " is outside [0, ", steps, ").");
  const int64_t b = options_.global_batch;
  return step + 1 < steps ? b : options_.dataset_size - step * b;
}

std::vector<int64_t> BalancedBatches::rank_rows(int64_t step, const std::vector<double>& weights) const {
  DATAPAR_CHECK(static_cast<int64_t>(weights.size()) == options_.world_size, "BalancedBatches: ", weights.size(),
                " weights for ", options_.world_size, " ranks; give one per rank.");
  // global_rows >= world_size, so every rank gets at least one row.
  return weighted_chunk_sizes(global_rows(step), weights);
}

at::Tensor BalancedBatches::global_batch(int64_t step) const {
  const int64_t begin = step * options_.global_batch;
  return order_.slice(0, begin, begin + global_rows(step)).contiguous();
}

std::vector<at::Tensor> BalancedBatches::batches(int64_t first_step, const std::vector<double>& weights) const {
  const int64_t steps = num_steps();
  DATAPAR_CHECK(first_step >= 0 && first_step <= steps, "BalancedBatches: first step ", first_step,
                " is outside [0, ", steps, "].");
  std::vector<at::Tensor> mine;
  for (int64_t step = first_step; step < steps; ++step) {
    const std::vector<int64_t> rows = rank_rows(step, weights);
    int64_t begin = step * options_.global_batch;
    for (int64_t r = 0; r < options_.rank; ++r) begin += rows[r];
    mine.push_back(order_.slice(0, begin, begin + rows[options_.rank]).contiguous());
  }
  return mine;
}

}  // namespace datapar
