// The per-step protocol of fault-tolerant training (issue 31, docs/fault_tolerance.md),
// whatever the wrapper: join a membership epoch when needed and take the newest state,
// train the step, vote, apply the update only on a commit; a failure of a member means
// training the step again over the new membership. ft::FaultTolerantDdp (DDP, ZeRO-1) and
// ft::FaultTolerantFsdp (FSDP) are this loop with their own parts.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>

#include "datapar/ft/elastic_group.h"
#include "datapar/ft/standing.h"

namespace datapar::ft {

// Collectives the members run together between two steps (an evaluation, gathering a
// checkpoint), run again over a new membership when a member fails in them: fn(rank, size).
using BetweenSteps = std::function<void(int rank, int size)>;

namespace detail {

// Whether an exception from a step is a failure of the membership (a member died, hung or
// left: train the step again) rather than an error of the program: datapar's CommError and
// TimeoutError, or anything once the epoch's group was aborted.
bool is_membership_failure(std::exception_ptr error, const ElasticGroup& elastic);

class StepProtocol {
 public:
  // The steps committed so far: the step the next train_step trains.
  int64_t step() const { return step_; }
  // Membership epochs joined so far (1 in a run without failures or newcomers).
  int64_t epochs_joined() const { return epochs_joined_; }
  ElasticGroup& elastic() { return elastic_; }

 protected:
  StepProtocol(ElasticGroup& elastic, int64_t step) : elastic_(elastic), step_(step) {}
  virtual ~StepProtocol() = default;
  StepProtocol(const StepProtocol&) = delete;
  StepProtocol& operator=(const StepProtocol&) = delete;

  // One step (FaultTolerantDdp::train_step says what it does): `train(rank, size)` runs
  // forward and backward on this rank's share.
  bool run_step(const std::function<void(int rank, int size)>& train, const BetweenSteps& before);
  // After the last step (FaultTolerantDdp::finish).
  void run_finish(const BetweenSteps& last);

  // The wrapper's parts. ready(): it has the current epoch's wrapper. rebuild(): after
  // joining, take the newest state (setting step_, and standing_ as it goes: when rebuild
  // throws, step_ becomes standing_.step) and make the epoch's wrapper. drop(): forget the wrapper (its group failed, or a new epoch comes).
  virtual bool ready() const = 0;
  virtual void rebuild() = 0;
  virtual void drop() = 0;
  virtual void zero_grad() = 0;
  // After train, before the vote: the collectives the update needs besides the wrapper's.
  virtual void before_vote() {}
  // The committed step's update.
  virtual void apply() = 0;
  // After a committed step (the step is committed whatever happens here).
  virtual void after_commit() {}

  ElasticGroup& elastic_;
  int64_t step_;
  Standing standing_;  // this member's, for the wrappers that re-shard state

 private:
  void reconfigure();
  void fail(std::exception_ptr error);

  int64_t epochs_joined_ = 0;
  int64_t before_epoch_ = -1, before_step_ = -1;  // where `before` last ran
};

}  // namespace detail
}  // namespace datapar::ft
