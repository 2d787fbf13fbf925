// The per-step protocol of fault-tolerant training (issue 31, docs/fault_tolerance.md),
// whatever the wrapper: join a membership epoch when needed and take the newest state,
// train the step, vote, apply the update only on a commit; a failure of a member means
// training the step again over the new membership. ft::FaultTolerantDdp (DDP, ZeRO-1) and
// ft::FaultTolerantFsdp (FSDP) are this loop with their own parts.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "datapar/amp/grad_scaler.h"
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
  // Mixed precision in float16 (datapar/amp/grad_scaler.h; FaultTolerantDdp and
  // FaultTolerantFsdp make it public): the losses the train function
  // backpropagates are scaler->scale(loss). Each step's gradients are unscaled before the
  // vote and checked for an inf or NaN (agreed over the membership where members hold
  // different shards); a committed step with one skips the update on every member and
  // halves the scale, as GradScaler::step and update. The scale changes only with a
  // committed step, and follows the model to a member that joins, so the scale, the skipped
  // steps and the model do not depend on who is alive either. Give it before the first
  // step, the scaler's state as the job starts or resumes, without a group (null: none).
  void use_grad_scaler(amp::GradScaler* scaler);

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
  // Under a gradient scaler: the gradients this member's update reads, and whether other
  // members read others (a shard each: an overflow is then agreed over the group).
  virtual std::vector<at::Tensor> update_gradients() { return {}; }
  virtual bool update_gradients_sharded() const { return false; }

  // apply() of a step every member voted to commit, or that one committed and this member
  // missed the outcome of (Note [A voted step whose outcome a member missed]): under a
  // scaler, skipped when the step's gradients overflowed, and the scale updated.
  void apply_voted();

  ElasticGroup& elastic_;
  int64_t step_;
  Standing standing_;  // this member's, for the wrappers that re-shard state

 private:
  void reconfigure();
  void fail(std::exception_ptr error);
  // Under a scaler: unscales the step's gradients and agrees whether all are finite.
  void unscale();
  // Under a scaler, after rebuild(): the scaler's state of the newest step from a member at it.
  void take_newest_scale();

  amp::GradScaler* scaler_ = nullptr;
  int64_t scaler_step_ = 0;   // the committed steps the scaler's state has seen
  bool step_finite_ = true;   // the trained step's gradients, as agreed before the vote
  int64_t epochs_joined_ = 0;
  int64_t before_epoch_ = -1, before_step_ = -1;  // where `before` last ran
};

}  // namespace detail
}  // namespace datapar::ft
