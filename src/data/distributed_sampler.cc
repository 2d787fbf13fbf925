// DistributedSampler. See distributed_sampler.h; the index arithmetic follows PyTorch's
// torch/utils/data/distributed.py line for line, so that the lists agree with Python's.
#include "datapar/data/distributed_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "datapar/error.h"

namespace datapar {

DistributedSampler::DistributedSampler(DistributedSamplerOptions options) : options_(options) {
  DATAPAR_CHECK(options_.dataset_size >= 0, "DistributedSampler: dataset_size is ", options_.dataset_size,
                "; give the number of samples in the dataset (>= 0).");
  DATAPAR_CHECK(options_.world_size >= 1, "DistributedSampler: world_size is ", options_.world_size,
                "; it must be at least 1 (the number of ranks sharing the dataset).");
  DATAPAR_CHECK(options_.rank >= 0 && options_.rank < options_.world_size, "DistributedSampler: rank ",
                options_.rank, " is outside [0, ", options_.world_size, "). Give each process its rank in the job.");
  const int64_t n = options_.dataset_size;
  const int64_t w = options_.world_size;
  // PyTorch: with drop_last and a remainder, ceil((n - w) / w), which is n / w; otherwise
  // ceil(n / w).
  num_samples_ = options_.drop_last ? n / w : (n + w - 1) / w;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  DATAPAR_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch is ", epoch, "; epochs count from 0.");
  epoch_ = epoch;
  position_ = 0;
}

int64_t DistributedSampler::num_real_samples() const {
  if (options_.drop_last) return num_samples_;
  // Positions rank, rank + w, ... that fall before dataset_size in the padded list.
  const int64_t ahead = options_.dataset_size - options_.rank;
  return ahead <= 0 ? 0 : (ahead + options_.world_size - 1) / options_.world_size;
}

at::Tensor DistributedSampler::indices() const {
  const int64_t n = options_.dataset_size;
  const int64_t total = total_size();
  at::Tensor order;
  if (options_.shuffle) {
    // torch.Generator().manual_seed(seed + epoch) in Python is this generator, and
    // randperm draws from it the same way, so the permutation is PyTorch's.
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch_));
    order = at::randperm(n, generator, at::TensorOptions(at::kLong));
  } else {
    order = at::arange(n, at::TensorOptions(at::kLong));
  }
  if (total > n) {
    // Wrap padding: position p of the padded list is order[p % n] (PyTorch appends the
    // list's head, repeated as often as needed).
    order = order.index_select(0, at::arange(total, at::TensorOptions(at::kLong)).remainder(n));
  } else {
    order = order.slice(0, 0, total);
  }
  return order.slice(0, options_.rank, total, options_.world_size).contiguous();
}

at::Tensor DistributedSampler::remaining() const { return indices().slice(0, position_).contiguous(); }

bool DistributedSampler::is_padding(int64_t i) const {
  DATAPAR_CHECK(i >= 0 && i < num_samples_, "DistributedSampler::is_padding: position ", i,
                " is outside this rank's list [0, ", num_samples_, ").");
  return !options_.drop_last && options_.rank + i * options_.world_size >= options_.dataset_size;
}

at::Tensor DistributedSampler::padding_mask(int64_t begin, int64_t end) const {
  DATAPAR_CHECK(0 <= begin && begin <= end && end <= num_samples_, "DistributedSampler::padding_mask: range [",
                begin, ", ", end, ") is not inside this rank's list [0, ", num_samples_, ").");
  at::Tensor positions = at::arange(begin, end, at::TensorOptions(at::kLong));
  if (options_.drop_last) return at::zeros({end - begin}, at::TensorOptions(at::kBool));
  return (positions * options_.world_size + options_.rank).ge(options_.dataset_size);
}

void DistributedSampler::advance(int64_t n) {
  DATAPAR_CHECK(n >= 0 && position_ + n <= num_samples_, "DistributedSampler::advance: moving ", n,
                " samples from position ", position_, " passes the end of this rank's list (", num_samples_,
                " samples). Call set_epoch() to start the next epoch.");
  position_ += n;
}

SamplerState DistributedSampler::state() const {
  return {epoch_, options_.seed, position_, options_.dataset_size, options_.world_size};
}

void DistributedSampler::load_state(const SamplerState& state) {
  DATAPAR_CHECK(state.dataset_size == options_.dataset_size && state.world_size == options_.world_size,
                "DistributedSampler::load_state: the state was saved for ", state.dataset_size, " samples over ",
                state.world_size, " ranks, but this sampler has ", options_.dataset_size, " samples over ",
                options_.world_size,
                " ranks. Resume with the same dataset and world size, or start the epoch afresh with set_epoch().");
  DATAPAR_CHECK(state.epoch >= 0, "DistributedSampler::load_state: epoch is ", state.epoch, "; epochs count from 0.");
  DATAPAR_CHECK(state.consumed >= 0 && state.consumed <= num_samples_, "DistributedSampler::load_state: ",
                state.consumed, " samples consumed is outside [0, ", num_samples_, "] for this rank.");
  epoch_ = state.epoch;
  options_.seed = state.seed;
  position_ = state.consumed;
}

}  // namespace datapar
