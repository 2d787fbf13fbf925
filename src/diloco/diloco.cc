// DiLoCo. See datapar/diloco/diloco.h.
#include "datapar/diloco/diloco.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "datapar/error.h"

namespace datapar {

void DiLoCo::check_options() const {
  DATAPAR_CHECK(group_ != nullptr, "DiLoCo: the process group is null.");
  DATAPAR_CHECK(!params_.empty(), "DiLoCo: no parameters.");
  DATAPAR_CHECK(options_.sync_every >= 1, "DiLoCo: sync_every is ", options_.sync_every,
                "; the ranks average every 1 or more inner steps.");
  DATAPAR_CHECK(options_.outer == "nesterov" || options_.outer == "replace", "DiLoCo: the outer step \"",
                options_.outer, "\" is not one of nesterov (DiLoCo) and replace (local SGD).");
  DATAPAR_CHECK(options_.outer_lr > 0 && options_.outer_momentum >= 0 && options_.outer_momentum < 1,
                "DiLoCo: the outer learning rate is ", options_.outer_lr, " and its momentum ", options_.outer_momentum,
                "; use a positive rate and a momentum in [0, 1).");
}

DiLoCo::DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group, DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(std::move(options)) {
  check_options();
  const torch::NoGradGuard no_grad;
  std::vector<at::Tensor> values;
  for (const at::Tensor& p : params_) values.push_back(p.detach());
  group_->broadcast_coalesced(values, 0)->wait();  // every rank from rank 0's
  for (const at::Tensor& p : params_) {
    start_.push_back(p.detach().clone());
    momentum_.push_back(at::zeros_like(p));
  }
}

DiLoCo::DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group, DiLoCoOptions options,
               const StateDict& state)
    : params_(std::move(params)), group_(std::move(group)), options_(std::move(options)) {
  check_options();
  load_state_dict(state);
}

DiLoCo::~DiLoCo() = default;

bool DiLoCo::step() {
  ++inner_steps_;
  if (++since_sync_ < options_.sync_every) return false;
  sync();
  return true;
}

void DiLoCo::sync() {
  const torch::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : params_) flat.push_back(p.detach().reshape({-1}));
  at::Tensor average = at::cat(flat);
  group_->all_reduce(average, ReduceOp::kSum)->wait();
  average.div_(group_->size());
  int64_t at = 0;
  const double mu = options_.outer_momentum, lr = options_.outer_lr;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor mine = average.narrow(0, at, params_[i].numel()).view(params_[i].sizes());
    at += params_[i].numel();
    if (options_.outer == "replace") {
      start_[i].copy_(mine);
    } else {
      // SGD with Nesterov momentum on the pseudo-gradient, as torch.optim.SGD(nesterov=True).
      const at::Tensor pseudo = start_[i] - mine;
      momentum_[i].mul_(mu).add_(pseudo);
      start_[i].sub_(pseudo.add(momentum_[i], mu), lr);
    }
    params_[i].detach().copy_(start_[i]);
  }
  ++rounds_;
  since_sync_ = 0;
}

StateDict DiLoCo::state_dict() const {
  StateDict out;
  out.insert("inner_steps", at::tensor(inner_steps_, at::kLong));
  out.insert("rounds", at::tensor(rounds_, at::kLong));
  out.insert("since_sync", at::tensor(since_sync_, at::kLong));
  for (size_t i = 0; i < params_.size(); ++i) {
    out.insert("start." + std::to_string(i), start_[i]);
    out.insert("momentum." + std::to_string(i), momentum_[i]);
  }
  return out;
}

void DiLoCo::load_state_dict(const StateDict& state) {
  const auto get = [&](const std::string& key, const at::Tensor& like) {
    const at::Tensor* t = state.find(key);
    DATAPAR_CHECK(t != nullptr, "DiLoCo::load_state_dict: no \"", key, "\" in the state; is it a DiLoCo's of this "
                  "model?");
    DATAPAR_CHECK(!like.defined() || (t->sizes() == like.sizes() && t->scalar_type() == like.scalar_type()),
                  "DiLoCo::load_state_dict: \"", key, "\" is ", t->sizes(), " ", t->scalar_type(), ", the model's ",
                  like.sizes(), " ", like.scalar_type(), ".");
    return *t;
  };
  std::vector<int64_t> counts;
  for (const char* key : {"inner_steps", "since_sync", "rounds"}) {
    const at::Tensor t = get(key, at::Tensor());
    DATAPAR_CHECK(t.numel() == 1 && t.scalar_type() == at::kLong && t.item<int64_t>() >= 0,
                  "DiLoCo::load_state_dict: \"", key, "\" is not a count.");
    counts.push_back(t.item<int64_t>());
  }
  std::vector<at::Tensor> start, momentum;
  for (size_t i = 0; i < params_.size(); ++i) {
    start.push_back(get("start." + std::to_string(i), params_[i]).clone());
    momentum.push_back(get("momentum." + std::to_string(i), params_[i]).clone());
  }
  start_ = std::move(start);
  momentum_ = std::move(momentum);
  inner_steps_ = counts[0];
  since_sync_ = counts[1];
  rounds_ = counts[2];
}

}  // namespace datapar
