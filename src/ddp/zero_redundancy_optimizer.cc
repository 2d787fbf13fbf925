// See zero_redundancy_optimizer.h.
//
// Note [Moving optimizer state]
// consolidate() sends, owner by owner, first a small metadata broadcast (per owned parameter:
// whether it has state, Adam's step count, whether amsgrad's maximum exists), then the state
// tensors themselves in one coalesced broadcast, received into scratch tensors shaped like
// the parameters. Broadcasts, not sends, so that every backend (nccl included) and every
// device moves them the same way; ranks other than the destination drop what they receive,
// one owner at a time, so no rank ever holds more than one owner's state besides its own.
#include "datapar/ddp/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "optim/state_key.h"
#include "collectives/coalesce.h"
#include "trace/recorder.h"

namespace datapar {
namespace {

namespace optim = torch::optim;
using detail::str_cat;

enum class Kind { kSgd, kAdam, kAdamW, kOther };

Kind kind_of(const optim::Optimizer& o) {
  if (dynamic_cast<const optim::SGD*>(&o)) return Kind::kSgd;
  if (dynamic_cast<const optim::Adam*>(&o)) return Kind::kAdam;
  if (dynamic_cast<const optim::AdamW*>(&o)) return Kind::kAdamW;
  return Kind::kOther;
}

// The state tensors of one parameter, in a fixed order (undefined ones left out).
std::vector<at::Tensor> state_tensors(Kind kind, const optim::OptimizerParamState& s) {
  std::vector<at::Tensor> out;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) out.push_back(t);
  };
  if (kind == Kind::kSgd) {
    add(static_cast<const optim::SGDParamState&>(s).momentum_buffer());
  } else if (kind == Kind::kAdam) {
    const auto& a = static_cast<const optim::AdamParamState&>(s);
    add(a.exp_avg());
    add(a.exp_avg_sq());
    add(a.max_exp_avg_sq());
  } else if (kind == Kind::kAdamW) {
    const auto& a = static_cast<const optim::AdamWParamState&>(s);
    add(a.exp_avg());
    add(a.exp_avg_sq());
    add(a.max_exp_avg_sq());
  }
  return out;
}

// [has state, step, has amsgrad's maximum] of one parameter's state (null: none).
std::array<int64_t, 3> state_meta(Kind kind, const optim::OptimizerParamState* s) {
  if (s == nullptr) return {0, 0, 0};
  if (kind == Kind::kSgd) {
    return {static_cast<const optim::SGDParamState*>(s)->momentum_buffer().defined() ? 1 : 0, 0, 0};
  }
  if (kind == Kind::kAdam) {
    const auto* a = static_cast<const optim::AdamParamState*>(s);
    return {1, a->step(), a->max_exp_avg_sq().defined() ? 1 : 0};
  }
  const auto* a = static_cast<const optim::AdamWParamState*>(s);
  return {1, a->step(), a->max_exp_avg_sq().defined() ? 1 : 0};
}

// A state made of `tensors` (as state_tensors() orders them) and `meta`.
template <typename AdamState>
std::unique_ptr<optim::OptimizerParamState> adam_state(const std::array<int64_t, 3>& meta,
                                                       const std::vector<at::Tensor>& tensors) {
  auto s = std::make_unique<AdamState>();
  s->step(meta[1]);
  s->exp_avg(tensors.at(0));
  s->exp_avg_sq(tensors.at(1));
  if (meta[2]) s->max_exp_avg_sq(tensors.at(2));
  return s;
}

std::unique_ptr<optim::OptimizerParamState> make_state(Kind kind, const std::array<int64_t, 3>& meta,
                                                       const std::vector<at::Tensor>& tensors) {
  if (kind == Kind::kSgd) {
    auto s = std::make_unique<optim::SGDParamState>();
    s->momentum_buffer(tensors.at(0));
    return s;
  }
  if (kind == Kind::kAdam) return adam_state<optim::AdamParamState>(meta, tensors);
  return adam_state<optim::AdamWParamState>(meta, tensors);
}

// A deep copy: the copy shares no tensor with `s`.
std::unique_ptr<optim::OptimizerParamState> copy_state(Kind kind, const optim::OptimizerParamState& s) {
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& t : state_tensors(kind, s)) tensors.push_back(t.clone());
  return make_state(kind, state_meta(kind, &s), tensors);
}

// How many tensors a parameter's state has, from its metadata.
size_t tensor_count(Kind kind, const std::array<int64_t, 3>& meta) {
  if (!meta[0]) return 0;
  return kind == Kind::kSgd ? 1 : 2 + (meta[2] ? 1 : 0);
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kSgd: return "SGD";
    case Kind::kAdam: return "Adam";
    case Kind::kAdamW: return "AdamW";
    case Kind::kOther: break;
  }
  return "an optimizer other than SGD, Adam and AdamW";
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params, Factory make,
                                                 std::shared_ptr<ProcessGroup> group, ZeroOptions options)
    : params_(std::move(params)), make_(std::move(make)), group_(group ? std::move(group) : default_group()) {
  DATAPAR_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameters to optimize.");
  DATAPAR_CHECK(make_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory is empty.");
  const int world = group_->size();
  // Largest first, each to the least loaded rank (stable: the same on every rank).
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(world, 0);
  owner_.assign(params_.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = r;
    load[r] += params_[i].numel();
  }
  owned_.assign(world, {});
  for (size_t i = 0; i < params_.size(); ++i) owned_[owner_[i]].push_back(params_[i]);
  if (options.parameters_as_bucket_view) {
    for (const std::vector<at::Tensor>& owned : owned_) detail::pack_back_to_back(owned);  // broadcast in place
  }
  const std::vector<at::Tensor>& mine = owned_[group_->rank()];
  if (!mine.empty()) {
    shard_ = make_(mine);
    DATAPAR_CHECK(shard_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned null.");
    DATAPAR_CHECK(shard_->param_groups().size() == 1, "ZeroRedundancyOptimizer: the factory's optimizer has ",
                  shard_->param_groups().size(), " parameter groups; give it exactly the parameters it is handed, "
                  "as one group.");
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::zero_grad() {
  // In place, as libtorch 1.x's Optimizer::zero_grad: gradients that are views of DDP's
  // buckets (gradient_as_bucket_view) stay views.
  for (at::Tensor& p : params_) {
    at::Tensor& g = p.mutable_grad();
    if (!g.defined()) continue;
    g.detach_();
    g.zero_();
  }
}

void ZeroRedundancyOptimizer::step() {
  {
    torch::NoGradGuard no_grad;
    if (shard_) shard_->step();
  }
  // Every owner's parameters to everyone, all broadcasts in flight at once; detached, since
  // the backend writes into them on its own thread, where grad mode is on.
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < group_->size(); ++r) {
    if (owned_[r].empty()) continue;
    std::vector<at::Tensor> tensors;
    int64_t bytes = 0;
    for (const at::Tensor& p : owned_[r]) {
      tensors.push_back(p.detach());
      bytes += static_cast<int64_t>(p.nbytes());
    }
    const trace::detail::CollectiveLabel label("zero shard", r, bytes);
    works.push_back(group_->broadcast_coalesced(std::move(tensors), r));
  }
  for (auto& w : works) w->wait();
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  if (!shard_) return 0;
  const Kind kind = kind_of(*shard_);
  int64_t bytes = 0;
  for (const auto& entry : shard_->state()) {
    for (const at::Tensor& t : state_tensors(kind, *entry.second)) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::consolidate(int to) {
  DATAPAR_CHECK(to >= 0 && to < group_->size(), "ZeroRedundancyOptimizer::consolidate: rank ", to,
                " is outside [0, ", group_->size(), ").");
  // Every rank learns the kind alike, even one that owns nothing: from an optimizer over one
  // parameter, which holds no state yet.
  const Kind kind = kind_of(*make_({params_.front()}));
  DATAPAR_CHECK(kind != Kind::kOther, "ZeroRedundancyOptimizer::consolidate: supports SGD, Adam and AdamW, not ",
                kind_name(kind), ".");
  const int rank = group_->rank();
  std::unique_ptr<optim::Optimizer> full;
  using StateMap = std::decay_t<decltype(shard_->state())>;
  if (rank == to) {
    full = make_(params_);
    if (shard_) full->param_groups()[0].set_options(shard_->param_groups()[0].options().clone());
  }
  // Note [Moving optimizer state]
  for (int owner = 0; owner < group_->size(); ++owner) {
    const std::vector<at::Tensor>& theirs = owned_[owner];
    if (theirs.empty()) continue;
    if (owner == to) {  // already there: copies, so the two optimizers share nothing
      if (rank != to) continue;
      for (const at::Tensor& p : theirs) {
        auto it = shard_->state().find(detail::optimizer_state_key<StateMap>(p));
        if (it != shard_->state().end()) full->state()[detail::optimizer_state_key<StateMap>(p)] = copy_state(kind, *it->second);
      }
      continue;
    }
    std::vector<int64_t> meta_values;
    for (const at::Tensor& p : theirs) {
      const optim::OptimizerParamState* s = nullptr;
      if (rank == owner) {
        auto it = shard_->state().find(detail::optimizer_state_key<StateMap>(p));
        if (it != shard_->state().end()) s = it->second.get();
      }
      for (int64_t v : state_meta(kind, s)) meta_values.push_back(v);
    }
    at::Tensor meta_tensor = metadata_tensor(*group_, meta_values);
    group_->broadcast(meta_tensor, owner)->synchronize();  // read on the host
    const std::vector<int64_t> meta = host_int64s(meta_tensor);
    std::vector<at::Tensor> tensors;
    for (size_t j = 0; j < theirs.size(); ++j) {
      const std::array<int64_t, 3> m{meta[3 * j], meta[3 * j + 1], meta[3 * j + 2]};
      if (rank == owner) {
        auto it = shard_->state().find(detail::optimizer_state_key<StateMap>(theirs[j]));
        if (m[0]) {
          for (const at::Tensor& t : state_tensors(kind, *it->second)) tensors.push_back(t.detach());
        }
      } else {
        for (size_t t = 0; t < tensor_count(kind, m); ++t) tensors.push_back(at::empty_like(theirs[j]));
      }
    }
    if (!tensors.empty()) group_->broadcast_coalesced(tensors, owner)->wait();
    if (rank != to) continue;
    size_t next = 0;
    for (size_t j = 0; j < theirs.size(); ++j) {
      const std::array<int64_t, 3> m{meta[3 * j], meta[3 * j + 1], meta[3 * j + 2]};
      const size_t n = tensor_count(kind, m);
      if (n == 0) continue;
      const std::vector<at::Tensor> own(tensors.begin() + static_cast<std::ptrdiff_t>(next),
                                        tensors.begin() + static_cast<std::ptrdiff_t>(next + n));
      full->state()[detail::optimizer_state_key<StateMap>(theirs[j])] = make_state(kind, m, own);
      next += n;
    }
  }
  return full;
}

void ZeroRedundancyOptimizer::load_full_state(const optim::Optimizer& full) {
  const Kind kind = kind_of(full);
  DATAPAR_CHECK(kind != Kind::kOther, "ZeroRedundancyOptimizer::load_full_state: supports SGD, Adam and AdamW.");
  DATAPAR_CHECK(full.param_groups().size() == 1 && full.param_groups()[0].params().size() == params_.size(),
                "ZeroRedundancyOptimizer::load_full_state: the optimizer must hold the ", params_.size(),
                " parameters of this one in one group; it has ", full.param_groups().size(), " group(s) with ",
                full.param_groups().empty() ? 0 : full.param_groups()[0].params().size(), " parameters in the first.");
  if (!shard_) return;
  DATAPAR_CHECK(kind_of(*shard_) == kind, "ZeroRedundancyOptimizer::load_full_state: the optimizer is ",
                kind_name(kind), ", this one's shards are ", kind_name(kind_of(*shard_)), ".");
  const auto& theirs = full.param_groups()[0].params();
  for (size_t i = 0; i < params_.size(); ++i) {
    DATAPAR_CHECK(theirs[i].sizes() == params_[i].sizes(), "ZeroRedundancyOptimizer::load_full_state: parameter ", i,
                  " is ", theirs[i].sizes(), " there and ", params_[i].sizes(), " here.");
  }
  using StateMap = std::decay_t<decltype(shard_->state())>;
  shard_->param_groups()[0].set_options(full.param_groups()[0].options().clone());
  shard_->state().clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != group_->rank()) continue;
    // Keyed by `full`'s own parameter i, stored under ours: the same tensor or its twin.
    auto it = full.state().find(detail::optimizer_state_key<StateMap>(theirs[i]));
    if (it == full.state().end()) continue;
    std::unique_ptr<optim::OptimizerParamState> copy = copy_state(kind, *it->second);
    for (const at::Tensor& t : state_tensors(kind, *copy)) {
      DATAPAR_CHECK(t.sizes() == params_[i].sizes(), "ZeroRedundancyOptimizer::load_full_state: parameter ", i,
                    "'s state is ", t.sizes(), ", the parameter ", params_[i].sizes(), ".");
    }
    shard_->state()[detail::optimizer_state_key<StateMap>(params_[i])] = std::move(copy);
  }
}

}  // namespace datapar
