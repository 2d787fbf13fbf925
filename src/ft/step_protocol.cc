// See datapar/ft/step_protocol.h.
#include "datapar/ft/step_protocol.h"

#include "datapar/error.h"
#include "datapar/ft/membership/membership.h"

namespace datapar::ft::detail {

bool is_membership_failure(std::exception_ptr error, const ElasticGroup& elastic) {
  try {
    std::rethrow_exception(error);
  } catch (const MembershipError&) {
    return false;  // the job stops
  } catch (const CommError&) {
    return true;
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    // Autograd may wrap what a hook threw; once the group was aborted, it is that.
    return elastic.aborted();
  }
}

void StepProtocol::fail(std::exception_ptr error) {
  if (!is_membership_failure(error, elastic_)) std::rethrow_exception(error);
  elastic_.abort();  // first: a wrapper's destructor waits for its collectives in flight
  drop();
}

void StepProtocol::reconfigure() {
  drop();
  standing_.step = step_;
  elastic_.join(step_);
  ++epochs_joined_;
  try {
    rebuild();
  } catch (...) {
    step_ = standing_.step;  // what this member keeps now (a missed vote it applied meanwhile)
    throw;
  }
}

bool StepProtocol::run_step(const std::function<void(int, int)>& train, const BetweenSteps& before) {
  try {
    if (!ready()) reconfigure();
    if (before && (before_epoch_ != elastic_.epoch().number || before_step_ != step_)) {
      before(elastic_.rank(), elastic_.size());
      before_epoch_ = elastic_.epoch().number;
      before_step_ = step_;
    }
    zero_grad();
    train(elastic_.rank(), elastic_.size());
    before_vote();
    standing_.voted_step = step_;  // Note [A voted step whose outcome a member missed] (src/ft/standings.h)
    standing_.voted_epoch = elastic_.epoch().number;
    const Vote vote = elastic_.vote(step_);
    standing_.voted_step = -1;
    if (vote.commit) {
      apply();
      ++step_;
      standing_.commit_epoch = elastic_.epoch().number;
    }
    if (vote.reconfigure) drop();
    if (!vote.commit || !ready()) return vote.commit;
  } catch (...) {
    fail(std::current_exception());
    return false;
  }
  try {
    after_commit();
  } catch (...) {
    fail(std::current_exception());  // joining again sets what the failure left behind
  }
  return true;
}

void StepProtocol::run_finish(const BetweenSteps& last) {
  while (last) {
    try {
      if (!ready()) reconfigure();
      last(elastic_.rank(), elastic_.size());
      elastic_.member().finished();
      break;
    } catch (...) {
      fail(std::current_exception());
    }
  }
  elastic_.leave();
}

}  // namespace datapar::ft::detail
