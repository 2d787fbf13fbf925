// See datapar/amp/grad_scaler.h.
#include "datapar/amp/grad_scaler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "datapar/process_group/work.h"
#include "datapar/reduce_op.h"

namespace datapar::amp {

namespace {

// What the constructor and load_state_dict take: PyTorch's constraints.
void check_options(const GradScalerOptions& o) {
  DATAPAR_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "GradScaler: init_scale ", o.init_scale,
                " must be positive and finite (PyTorch's default: 65536)");
  DATAPAR_CHECK(o.growth_factor > 1 && std::isfinite(o.growth_factor), "GradScaler: growth_factor ",
                o.growth_factor, " must be finite and above 1 (default 2)");
  DATAPAR_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "GradScaler: backoff_factor ", o.backoff_factor,
                " must be in (0, 1) (default 0.5)");
  DATAPAR_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval ", o.growth_interval,
                " must be at least 1 (default 2000)");
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)), scale_(options_.init_scale) {
  check_options(options_);
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (!options_.enabled) return loss;
  DATAPAR_CHECK(loss.defined() && loss.is_floating_point(), "GradScaler::scale: the loss must be a floating-point ",
                "tensor, not ", loss.defined() ? c10::toString(loss.scalar_type()) : "an undefined tensor");
  return loss * scale_;
}

bool GradScaler::unscale_gradients(const std::vector<at::Tensor>& gradients) const {
  if (!options_.enabled) return true;
  at::NoGradGuard no_grad;
  const double inverse = 1.0 / scale_;
  // One flag per device, read once: not a host sync per gradient.
  std::vector<at::Tensor> not_finite;
  for (const at::Tensor& gradient : gradients) {
    if (!gradient.defined()) continue;
    DATAPAR_CHECK(!gradient.is_sparse(), "GradScaler::unscale: sparse gradients are not supported");
    DATAPAR_CHECK(gradient.scalar_type() != at::kHalf,
                  "GradScaler::unscale: a float16 gradient cannot be unscaled (its small values are gone "
                  "already).\n---> HINT: keep the parameters float32 and compute in float16 under "
                  "datapar::amp::Autocast.");
    at::Tensor grad = gradient;  // shares the gradient's storage: unscaled in place
    grad.mul_(inverse);
    at::Tensor flag = at::isfinite(grad).all().logical_not();
    auto same = std::find_if(not_finite.begin(), not_finite.end(),
                             [&](const at::Tensor& f) { return f.device() == flag.device(); });
    if (same == not_finite.end()) {
      not_finite.push_back(flag);
    } else {
      *same = same->logical_or(flag);
    }
  }
  bool found = false;
  for (const at::Tensor& flag : not_finite) found = found || flag.item<bool>();
  return !found;
}

bool GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return true;
  DATAPAR_CHECK(found_inf_.count(&optimizer) == 0,
                "GradScaler::unscale: this optimizer's gradients were unscaled already since the last update() ",
                "(unscale() or step() twice in one iteration?)");
  std::vector<at::Tensor> gradients;
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    for (at::Tensor& param : group.params()) gradients.push_back(param.grad());
  }
  bool found = !unscale_gradients(gradients);
  if (options_.group) {
    // Each rank holds other gradients (a shard): the step is skipped on all or none.
    at::Tensor any = metadata_tensor(*options_.group, std::vector<int64_t>{found ? 1 : 0});
    options_.group->all_reduce(any, ReduceOp::kMax)->wait();
    found = host_int64s(any)[0] > 0;
  }
  found_inf_[&optimizer] = found;
  return !found;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (found_inf_.count(&optimizer) == 0) unscale(optimizer);
  if (found_inf_.at(&optimizer)) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  DATAPAR_CHECK(!found_inf_.empty(), "GradScaler::update: no optimizer was unscaled or stepped since the last ",
                "update(), so there is nothing to judge the scale by");
  bool found = false;
  for (const auto& entry : found_inf_) found = found || entry.second;
  found_inf_.clear();
  update(found);
}

void GradScaler::update(bool found_inf) {
  if (!options_.enabled) return;
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval) return;
  // A scale that would overflow stays (PyTorch's _amp_update_scale_).
  if (std::isfinite(scale_ * options_.growth_factor)) scale_ *= options_.growth_factor;
  growth_tracker_ = 0;
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", scale_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"_growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!options_.enabled) return;
  DATAPAR_CHECK(!state.empty(), "GradScaler::load_state_dict: the state is empty (saved from a disabled scaler?)");
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    DATAPAR_CHECK(state.count(key) == 1, "GradScaler::load_state_dict: the state has no \"", key, "\"");
  }
  GradScalerOptions loaded = options_;
  loaded.init_scale = state.at("scale");
  loaded.growth_factor = state.at("growth_factor");
  loaded.backoff_factor = state.at("backoff_factor");
  loaded.growth_interval = static_cast<int64_t>(state.at("growth_interval"));
  const double tracker = state.at("_growth_tracker");
  DATAPAR_CHECK(tracker >= 0 && tracker < static_cast<double>(loaded.growth_interval) && tracker == std::floor(tracker),
                "GradScaler::load_state_dict: _growth_tracker ", tracker, " is not a count below growth_interval ",
                loaded.growth_interval);
  check_options(loaded);
  options_ = loaded;
  scale_ = loaded.init_scale;
  growth_tracker_ = static_cast<int64_t>(tracker);
}

}  // namespace datapar::amp
