// DiLoCo. See datapar/diloco/diloco.h.
#include "datapar/diloco/diloco.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "diloco/outer_exchange.h"

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
  DATAPAR_CHECK(options_.fragments >= 1 && options_.fragments <= options_.sync_every, "DiLoCo: ", options_.fragments,
                " fragments for rounds of ", options_.sync_every, " inner steps; each fragment syncs at a step of ",
                "its own, so use 1 to sync_every fragments.");
  DATAPAR_CHECK(options_.outer_dtype == "float32" || options_.outer_dtype == "bf16" || options_.outer_dtype == "int8",
                "DiLoCo: the outer dtype \"", options_.outer_dtype, "\" is not one of float32, bf16 and int8.");
  for (const at::Tensor& p : params_) {
    DATAPAR_CHECK(p.scalar_type() == at::kFloat || options_.outer_dtype == "float32",
                  "DiLoCo: a quantised outer exchange (", options_.outer_dtype, ") takes float32 parameters, not ",
                  p.scalar_type(), ".");
  }
}

DiLoCo::DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group, DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(std::move(options)) {
  check_options();
  for (const at::Tensor& p : params_) numel_ += p.numel();
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
  for (const at::Tensor& p : params_) numel_ += p.numel();
  load_state_dict(state);
}

DiLoCo::~DiLoCo() = default;

bool DiLoCo::step() {
  ++inner_steps_;
  ++since_sync_;
  const int64_t k_count = options_.fragments, h = options_.sync_every;
  bool synced = false;
  for (int64_t k = 0; k < k_count; ++k) {
    if (since_sync_ != h * (k + 1) / k_count) continue;  // fragment k's step of the round
    sync_range(numel_ * k / k_count, numel_ * (k + 1) / k_count);
    synced = true;
  }
  if (since_sync_ == h) {  // the last fragment's: the round is over
    since_sync_ = 0;
    ++rounds_;
  }
  return synced;
}

void DiLoCo::sync() {
  sync_range(0, numel_);
  ++rounds_;
  since_sync_ = 0;
}

namespace {

// Calls piece(i, at, length, offset) for each part of elements [begin, end) of `params` end
// to end: `length` elements of params[i] from its element `at`, at `offset` of the range.
template <typename Piece>
void for_each_piece(const std::vector<at::Tensor>& params, int64_t begin, int64_t end, const Piece& piece) {
  int64_t first = 0;
  for (size_t i = 0; i < params.size() && first < end; ++i) {
    const int64_t last = first + params[i].numel();
    const int64_t from = std::max(begin, first), to = std::min(end, last);
    if (from < to) piece(i, from - first, to - from, from - begin);
    first = last;
  }
}

}  // namespace

at::Tensor DiLoCo::flat(const std::vector<at::Tensor>& tensors, int64_t begin, int64_t end) const {
  at::Tensor out = at::empty({end - begin}, params_[0].options().requires_grad(false));
  for_each_piece(tensors, begin, end, [&](size_t i, int64_t at, int64_t length, int64_t offset) {
    out.narrow(0, offset, length).copy_(tensors[i].detach().reshape({-1}).narrow(0, at, length));
  });
  return out;
}

void DiLoCo::sync_range(int64_t begin, int64_t end) {
  step_range(begin, end, average_range(*group_, begin, end, std::nullopt).parameters);
}

DiLoCo::Average DiLoCo::average_parameters(ProcessGroup& group, double weight) const {
  DATAPAR_CHECK(options_.fragments == 1, "DiLoCo::average_parameters: the parameters sync in ", options_.fragments,
                " fragments; a round's average over another group takes them whole (fragments = 1).");
  DATAPAR_CHECK(weight >= 0, "DiLoCo::average_parameters: the weight is ", weight, "; use 0 or more.");
  return average_range(group, 0, numel_, weight);
}

void DiLoCo::outer_step(const Average& average) {
  DATAPAR_CHECK(average.parameters.defined() && average.parameters.numel() == numel_,
                "DiLoCo::outer_step: the average has ", average.parameters.defined() ? average.parameters.numel() : 0,
                " elements, the parameters ", numel_, "; pass what average_parameters returned.");
  step_range(0, numel_, average.parameters);
  ++rounds_;
  since_sync_ = 0;
}

DiLoCo::Average DiLoCo::average_range(ProcessGroup& group, int64_t begin, int64_t end,
                                      std::optional<double> weight) const {
  const torch::NoGradGuard no_grad;
  const at::Tensor start = flat(start_, begin, end);
  Average out;
  if (!weight) {
    out.weights = group.size();
    if (options_.outer_dtype == "float32") {
      out.parameters = flat(params_, begin, end);  // the parameters themselves: exact
      group.all_reduce(out.parameters, ReduceOp::kSum)->wait();
      out.parameters.div_(group.size());
    } else {
      // The pseudo-gradients, small and alike across ranks, quantise far better than the values.
      out.parameters = start - detail::outer_average(group, start - flat(params_, begin, end), options_.outer_dtype);
    }
    return out;
  }
  // Weighted: the weights' sum travels with the values (float32: as one more element), and
  // each rank's values are scaled by its weight first (0: they count for nothing).
  if (options_.outer_dtype == "float32") {
    at::Tensor sum = at::cat({flat(params_, begin, end).mul_(*weight), at::full({1}, *weight, start.options())});
    group.all_reduce(sum, ReduceOp::kSum)->wait();
    out.weights = sum[end - begin].item<double>();
    DATAPAR_CHECK(out.weights > 0, "DiLoCo::average_parameters: every rank's weight is 0; at least one rank must "
                  "have trained the round.");
    out.parameters = sum.narrow(0, 0, end - begin).div_(out.weights);
    return out;
  }
  at::Tensor weights = metadata_tensor(group, std::vector<double>{*weight});
  group.all_reduce(weights, ReduceOp::kSum)->wait();
  out.weights = host_doubles(weights)[0];
  DATAPAR_CHECK(out.weights > 0, "DiLoCo::average_parameters: every rank's weight is 0; at least one rank must have "
                "trained the round.");
  // outer_average divides by the ranks; the weighted mean divides by the weights' sum.
  const at::Tensor mean = detail::outer_average(group, (start - flat(params_, begin, end)).mul_(*weight),
                                                options_.outer_dtype);
  out.parameters = start - mean.mul_(group.size() / out.weights);
  return out;
}

void DiLoCo::step_range(int64_t begin, int64_t end, const at::Tensor& average) {
  const torch::NoGradGuard no_grad;
  const at::Tensor start = flat(start_, begin, end);
  at::Tensor updated = start.clone();
  if (options_.outer == "replace") {
    updated.copy_(average);
  } else {
    // SGD with Nesterov momentum on the pseudo-gradient, as torch.optim.SGD(nesterov=True).
    const double mu = options_.outer_momentum, lr = options_.outer_lr;
    const at::Tensor pseudo = start - average;
    at::Tensor momentum = flat(momentum_, begin, end);
    momentum.mul_(mu).add_(pseudo);
    updated.sub_(pseudo.add(momentum, mu), lr);
    for_each_piece(momentum_, begin, end, [&](size_t i, int64_t at, int64_t length, int64_t offset) {
      momentum_[i].view({-1}).narrow(0, at, length).copy_(momentum.narrow(0, offset, length));
    });
  }
  for_each_piece(params_, begin, end, [&](size_t i, int64_t at, int64_t length, int64_t offset) {
    const at::Tensor part = updated.narrow(0, offset, length);
    start_[i].view({-1}).narrow(0, at, length).copy_(part);
    params_[i].detach().view({-1}).narrow(0, at, length).copy_(part);
  });
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
