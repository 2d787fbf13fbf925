#include "datapar/ddp/rank_balancer.h"

#include <algorithm>
#include <cmath>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/parallel/data_parallel.h"  // detail::seconds_until_done
#include "datapar/process_group/metadata.h"

namespace datapar {
namespace {

// Every rank runs a row of every global batch at least (BalancedBatches): its fixed cost
// counts in every step.
LoadBalancerOptions every_rank_takes_part(LoadBalancerOptions options, int ranks) {
  options.takes_part.assign(static_cast<size_t>(ranks), true);
  return options;
}

std::shared_ptr<ProcessGroup> or_default(std::shared_ptr<ProcessGroup> group) {
  if (group) return group;
  DATAPAR_CHECK(is_initialized(), "RankBalancer: no process group given and none initialised; call "
                "init_process_group() first or pass a group.");
  return default_group();
}

}  // namespace

RankBalancer::RankBalancer(std::shared_ptr<ProcessGroup> group, RankBalancerOptions options)
    : group_(or_default(std::move(group))),
      options_(options),
      balancer_(static_cast<size_t>(group_->size()), every_rank_takes_part(options.balance, group_->size())) {
  DATAPAR_CHECK(options_.interval >= 1, "RankBalancer: interval is ", options_.interval, "; it must be >= 1 step.");
}

bool RankBalancer::step(int64_t rows, double seconds) {
  DATAPAR_CHECK(rows >= 0, "RankBalancer::step: ", rows, " rows.");
  DATAPAR_CHECK(std::isfinite(seconds) && seconds >= 0, "RankBalancer::step: ", seconds, " s.");
  rows_ += rows;
  seconds_ += seconds;
  if (++steps_ % options_.interval != 0) return false;

  // An all-gather as one all-reduce: each rank fills its own slots, the others are zero, so
  // the sums are exact and every rank ends with the same numbers.
  const int world = group_->size();
  const int rank = group_->rank();
  std::vector<double> slots(2 * static_cast<size_t>(world), 0.0);
  slots[rank] = static_cast<double>(rows_);
  slots[world + rank] = seconds_;
  at::Tensor t = metadata_tensor(*group_, slots);
  group_->all_reduce(t, ReduceOp::kSum)->synchronize();
  slots = host_doubles(t);
  rows_ = 0;
  seconds_ = 0;

  std::vector<int64_t> all_rows(world);
  std::vector<double> all_seconds(world);
  for (int r = 0; r < world; ++r) {
    all_rows[r] = static_cast<int64_t>(std::llround(slots[r]));
    all_seconds[r] = slots[world + r];
  }
  return balancer_.record(all_rows, all_seconds);
}

void RankBalancer::begin_step(const CommunicationStats& stats, const Device& device) {
  waited_before_ = stats.exposed_wait;
  step_device_ = device;
  step_start_ = std::chrono::steady_clock::now();
}

bool RankBalancer::end_step(int64_t rows, const CommunicationStats& stats) {
  DATAPAR_CHECK(step_start_.has_value(), "RankBalancer::end_step: no begin_step() before it.");
  const double busy = detail::seconds_until_done(*step_start_, step_device_);
  const double waited = std::chrono::duration<double>(stats.exposed_wait - waited_before_).count();
  step_start_.reset();
  return step(rows, std::max(0.0, busy - waited));  // a fast rank waiting for a slow one is not slow
}

}  // namespace datapar
