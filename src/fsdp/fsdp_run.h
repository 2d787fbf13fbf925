// One iteration of fully sharded data parallelism, across the units of a model: the order
// in which they ran (for prefetching), whether gradients synchronise (no_sync), each rank's
// share of the global batch, and the end of backward, where every unit's gradients must have
// been reduced. Owned by the FullyShardedDataParallel root.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "datapar/fsdp/fsdp_options.h"
#include "datapar/process_group/process_group.h"

namespace datapar::detail {

class FsdpUnit;

class FsdpRun {
 public:
  // units: every unit of the model, the root's own first (if it has one), then in the
  // model's order; attaches them. `options`: the root's.
  FsdpRun(std::shared_ptr<ProcessGroup> group, FsdpOptions options, std::vector<std::shared_ptr<FsdpUnit>> units);
  ~FsdpRun();  // detaches the units
  FsdpRun(const FsdpRun&) = delete;
  FsdpRun& operator=(const FsdpRun&) = delete;

  // The root's forward begins, with `samples` rows on this rank.
  void begin_iteration(int64_t samples);
  // A unit's forward begins: issues its all-gather and prefetches the next ones.
  void entered_forward(FsdpUnit& unit);
  // A unit's backward begins: issues its all-gather and prefetches the ones before it.
  void entered_backward(FsdpUnit& unit);
  // Some gradient of the model arrived: the end of this backward must be seen.
  void backward_touched();
  // A unit issued its reduce-scatter: the one before it completes now, or under HSDP goes
  // on to its all-reduce across replicas (Note [One reduce-scatter in flight]).
  void reduce_issued(FsdpUnit& unit);
  // Between the first hook of a backward and its end.
  bool in_backward() const { return end_queued_; }

  bool sync() const { return sync_; }
  void set_sync(bool on) { sync_ = on; }
  // This rank's weight in the gradient average, with average_by_samples; nullopt otherwise
  // (the mean over ranks).
  std::optional<double> sample_share();

  const std::vector<std::shared_ptr<FsdpUnit>>& units() const { return units_; }

 private:
  void end_of_backward();

  std::shared_ptr<ProcessGroup> group_;
  FsdpOptions options_;
  std::vector<std::shared_ptr<FsdpUnit>> units_;
  std::vector<FsdpUnit*> order_;           // forward order this iteration
  std::vector<FsdpUnit*> previous_order_;  // and the last one's: what forward prefetches by
  FsdpUnit* reducing_ = nullptr;           // the unit whose reduce-scatter was issued last
  FsdpUnit* replicating_ = nullptr;        // HSDP: the one before, reducing across replicas
  bool end_queued_ = false;
  bool sync_ = true;
  int64_t samples_ = 0;
  at::Tensor global_samples_;
  std::shared_ptr<Work> samples_work_;
  std::optional<double> share_;
};

}  // namespace datapar::detail
