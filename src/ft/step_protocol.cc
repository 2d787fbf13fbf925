// See datapar/ft/step_protocol.h.
#include "datapar/ft/step_protocol.h"

#include <cstring>
#include <string>

#include "datapar/error.h"
#include "datapar/ft/membership/membership.h"
#include "datapar/process_group/metadata.h"
#include "datapar/process_group/work.h"
#include "datapar/reduce_op.h"

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

void StepProtocol::use_grad_scaler(amp::GradScaler* scaler) {
  DATAPAR_CHECK(scaler == nullptr || scaler->options().group == nullptr,
                "ft: the gradient scaler of fault-tolerant training must have no group (GradScalerOptions::group): ",
                "the members agree on overflows over each membership themselves.");
  scaler_ = scaler != nullptr && scaler->is_enabled() ? scaler : nullptr;  // a disabled one changes nothing
  scaler_step_ = step_;
}

void StepProtocol::apply_voted() {
  if (scaler_ == nullptr) return apply();
  if (step_finite_) apply();
  scaler_->update(/*found_inf=*/!step_finite_);
  ++scaler_step_;
}

void StepProtocol::unscale() {
  bool finite = scaler_->unscale_gradients(update_gradients());
  if (update_gradients_sharded()) {
    ProcessGroup& group = *elastic_.group();
    at::Tensor any = metadata_tensor(group, std::vector<int64_t>{finite ? 0 : 1});
    group.all_reduce(any, ReduceOp::kMax)->wait();
    finite = host_int64s(any)[0] == 0;
  }
  step_finite_ = finite;
}

namespace {

// A scaler's state as bytes: the step it belongs to, then its scale and growth count.
std::string scale_record(int64_t step, double scale, int64_t tracker) {
  std::string bytes(3 * sizeof(int64_t), '\0');
  std::memcpy(bytes.data(), &step, sizeof step);
  std::memcpy(bytes.data() + 8, &scale, sizeof scale);
  std::memcpy(bytes.data() + 16, &tracker, sizeof tracker);
  return bytes;
}

}  // namespace

void StepProtocol::take_newest_scale() {
  const std::map<std::string, double> mine = scaler_->state_dict();
  const std::vector<std::string> records = all_gather_bytes(
      *elastic_.group(),
      scale_record(scaler_step_, mine.at("scale"), static_cast<int64_t>(mine.at("_growth_tracker"))));
  for (const std::string& record : records) {
    int64_t step = 0, tracker = 0;
    double scale = 0;
    DATAPAR_CHECK(record.size() == 3 * sizeof(int64_t), "ft: a member sent a gradient scaler record of ",
                  record.size(), " bytes, not 24 (is every member run with the gradient scaler?)");
    std::memcpy(&step, record.data(), sizeof step);
    std::memcpy(&scale, record.data() + 8, sizeof scale);
    std::memcpy(&tracker, record.data() + 16, sizeof tracker);
    if (step != step_) continue;
    std::map<std::string, double> newest = mine;
    newest["scale"] = scale;
    newest["_growth_tracker"] = static_cast<double>(tracker);
    scaler_->load_state_dict(newest);
    scaler_step_ = step_;
    return;
  }
  throw MembershipError(datapar::detail::str_cat("ft: no member has the gradient scaler's state of step ", step_,
                                                 ", the newest; the members that had it left the job."));
}

void StepProtocol::reconfigure() {
  drop();
  standing_.step = step_;
  elastic_.join(step_);
  ++epochs_joined_;
  try {
    rebuild();
    if (scaler_ != nullptr) take_newest_scale();
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
    if (scaler_ != nullptr) unscale();
    before_vote();
    standing_.voted_step = step_;  // Note [A voted step whose outcome a member missed] (src/ft/standings.h)
    standing_.voted_epoch = elastic_.epoch().number;
    const Vote vote = elastic_.vote(step_);
    standing_.voted_step = -1;
    if (vote.commit) {
      apply_voted();
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
