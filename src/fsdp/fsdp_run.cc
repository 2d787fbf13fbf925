// See fsdp_run.h.
//
// Note [Prefetching units]
// A unit's all-gather is issued when the unit before it starts computing, so the bytes move
// while that one computes. Forward prefetches by the order of the previous iteration (the
// first has none to go by); backward goes through the units in the reverse of this
// iteration's forward order, so when a unit's backward begins the units before it in
// forward are gathered next. Every rank must issue the same collectives in the same order:
// the prefetches follow the units' order, which is the same on every rank as long as the
// model runs the same units in the same order everywhere, which FSDP requires anyway (as
// PyTorch's). A prefetch that turns out unneeded costs memory until the end of backward,
// never correctness.
//
// Note [One reduce-scatter in flight]
// A unit's reduce-scatter holds its flat gradient (the unit's whole size) and its share until
// it completes. Left until the end of backward, every unit's would be alive at once: as much
// memory as the whole model's gradients, which sharding is meant to avoid. So when a unit
// issues its reduce-scatter, the one issued before it is awaited and its buffers freed, as
// PyTorch's FSDP does: each reduction still overlaps the backward of the unit after it.
// Under HSDP the one before is awaited only up to its reduce-scatter: its flat gradient is
// freed and the all-reduce of its shard across replicas issued, which overlaps the next
// unit's backward in turn and is awaited when the unit after that issues its own: at most
// one flat gradient and two shards in flight.
#include "fsdp/fsdp_run.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "autograd/end_of_backward.h"
#include "fsdp/fsdp_unit.h"

namespace datapar::detail {

FsdpRun::FsdpRun(std::shared_ptr<ProcessGroup> group, FsdpOptions options, std::vector<std::shared_ptr<FsdpUnit>> units)
    : group_(std::move(group)), options_(options), units_(std::move(units)) {
  for (const auto& unit : units_) unit->attach(this);
}

FsdpRun::~FsdpRun() {
  for (const auto& unit : units_) unit->attach(nullptr);
}

void FsdpRun::begin_iteration(int64_t samples) {
  // A forward with no backward after it (evaluation with grad on), or a backward that failed,
  // leaves units mid-iteration.
  for (const auto& unit : units_) unit->abandon_iteration();
  end_queued_ = false;
  reducing_ = replicating_ = nullptr;
  if (!order_.empty()) previous_order_ = std::move(order_);
  order_.clear();
  share_.reset();
  samples_work_.reset();
  if (options_.average_by_samples && at::GradMode::is_enabled()) {
    // Issued before any all-gather, awaited by the first reduce-scatter.
    samples_ = samples;
    global_samples_ =
        at::full({1}, static_cast<double>(samples), at::TensorOptions(group_->device()).dtype(at::kDouble));
    samples_work_ = group_->all_reduce(global_samples_, ReduceOp::kSum);
  }
}

void FsdpRun::entered_forward(FsdpUnit& unit) {
  unit.start_gather();
  if (end_queued_) return;  // a recomputation in backward: not the forward's order
  const size_t k = order_.size();
  order_.push_back(&unit);
  if (k >= previous_order_.size() || previous_order_[k] != &unit) return;
  for (size_t j = k + 1; j <= k + static_cast<size_t>(options_.prefetch) && j < previous_order_.size(); ++j) {
    previous_order_[j]->start_gather();
  }
}

void FsdpRun::entered_backward(FsdpUnit& unit) {
  backward_touched();
  unit.start_gather();
  const auto it = std::find(order_.rbegin(), order_.rend(), &unit);
  if (it == order_.rend()) return;
  const size_t k = order_.size() - 1 - static_cast<size_t>(it - order_.rbegin());
  for (size_t j = 1; j <= static_cast<size_t>(options_.prefetch) && j <= k; ++j) {
    FsdpUnit* before = order_[k - j];
    if (before->needs_backward() && !before->in_backward()) before->start_gather();
  }
}

void FsdpRun::reduce_issued(FsdpUnit& unit) {
  if (replicating_ != nullptr && replicating_ != &unit) replicating_->finish_reduce();
  replicating_ = nullptr;
  if (reducing_ != nullptr && reducing_ != &unit) {
    if (options_.replicate_group) {
      reducing_->reduce_across_replicas();
      replicating_ = reducing_;
    } else {
      reducing_->finish_reduce();
    }
  }
  reducing_ = &unit;
}

void FsdpRun::backward_touched() {
  if (end_queued_) return;
  end_queued_ = true;
  at_end_of_backward([this] { end_of_backward(); });
}

std::optional<double> FsdpRun::sample_share() {
  if (!options_.average_by_samples) return std::nullopt;
  if (!share_) {
    double global = static_cast<double>(samples_);
    if (samples_work_) {
      samples_work_->wait();
      // HSDP: the shard group's count, summed over the replicas: the job's.
      if (options_.replicate_group) options_.replicate_group->all_reduce(global_samples_, ReduceOp::kSum)->wait();
      global = global_samples_.item<double>();
    }
    // No sample anywhere: a zero gradient (the sum over no sample), not NaN.
    share_ = static_cast<double>(samples_) / std::max(global, 1.0);
  }
  return share_;
}

void FsdpRun::end_of_backward() {
  // Units whose gradients did not all arrive (a parameter unused in forward, an output off
  // the loss's path) reduce now, in the model's order, the same on every rank.
  for (const auto& unit : units_) {
    if (unit->needs_backward()) unit->reduce_gradients();
  }
  for (const auto& unit : units_) unit->finish_backward();
  reducing_ = replicating_ = nullptr;
  end_queued_ = false;
}

}  // namespace datapar::detail
