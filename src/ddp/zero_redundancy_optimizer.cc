// See zero_redundancy_optimizer.h.
#include "datapar/ddp/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <type_traits>

#include "datapar/distributed.h"
#include "datapar/error.h"
#include "optim/broadcast_param_states.h"
#include "optim/param_state.h"
#include "optim/state_key.h"
#include "tensor/coalesce.h"
#include "trace/recorder.h"

namespace datapar {
namespace {

namespace optim = torch::optim;
using Kind = detail::OptimizerKind;
using detail::optimizer_kind;
using detail::param_state_tensors;

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params, Factory make,
                                                 std::shared_ptr<ProcessGroup> group, ZeroOptions options)
    : params_(std::move(params)), make_(std::move(make)), options_(options), keeps_(params_.size(), false) {
  check_factory();
  group_ = group ? std::move(group) : default_group();
  const int world = group_->size();
  owner_ = detail::balanced_owners(params_, world);
  owned_.assign(world, {});
  for (size_t i = 0; i < params_.size(); ++i) {
    owned_[owner_[i]].push_back(params_[i]);
    keeps_[i] = keeper(owner_, i, group_->rank(), world);
  }
  if (options.parameters_as_bucket_view) {
    for (const std::vector<at::Tensor>& owned : owned_) detail::pack_back_to_back(owned);  // broadcast in place
  }
  rebuild({}, *hyper_);
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params, Factory make, ZeroOptions options)
    : params_(std::move(params)), make_(std::move(make)), options_(options), keeps_(params_.size(), true) {
  check_factory();
  rebuild({}, *hyper_);
}

void ZeroRedundancyOptimizer::check_factory() {
  DATAPAR_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameters to optimize.");
  DATAPAR_CHECK(make_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory is empty.");
  DATAPAR_CHECK(options_.copies == 1 || options_.copies == 2, "ZeroRedundancyOptimizer: copies is ", options_.copies,
                "; each shard is kept by 1 rank (ZeRO-1) or 2 (fault tolerance).");
  // Over one parameter (it holds no state yet): the kind and hyperparameters, which a rank
  // that keeps no parameter knows too.
  const std::unique_ptr<optim::Optimizer> probe = make_({params_.front()});
  DATAPAR_CHECK(probe != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned null.");
  DATAPAR_CHECK(probe->param_groups().size() == 1, "ZeroRedundancyOptimizer: the factory's optimizer has ",
                probe->param_groups().size(), " parameter groups; give it exactly the parameters it is handed, "
                "as one group.");
  const Kind kind = optimizer_kind(*probe);
  DATAPAR_CHECK(options_.copies == 1 || kind != Kind::kOther, "ZeroRedundancyOptimizer: with 2 copies of each "
                "shard it supports SGD, Adam and AdamW, whose state it can move between ranks; the factory made ",
                detail::optimizer_kind_name(kind), ".");
  hyper_ = probe->param_groups()[0].options().clone();
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

bool ZeroRedundancyOptimizer::keeper(const std::vector<int>& owners, size_t index, int rank, int size) const {
  return rank == owners[index] || (options_.copies == 2 && rank == (owners[index] + 1) % size);
}

ProcessGroup& ZeroRedundancyOptimizer::process_group() const {
  DATAPAR_CHECK(group_ != nullptr, "ZeroRedundancyOptimizer: not sharded over a group yet; reshard() first.");
  return *group_;
}

const optim::OptimizerParamState* ZeroRedundancyOptimizer::kept_state(size_t index) const {
  if (!shard_ || !keeps_[index]) return nullptr;
  using StateMap = std::decay_t<decltype(shard_->state())>;
  const auto it = shard_->state().find(detail::optimizer_state_key<StateMap>(params_[index]));
  return it == shard_->state().end() ? nullptr : it->second.get();
}

void ZeroRedundancyOptimizer::rebuild(std::map<size_t, std::unique_ptr<optim::OptimizerParamState>> states,
                                      const optim::OptimizerOptions& hyper) {
  std::vector<at::Tensor> kept;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (keeps_[i]) kept.push_back(params_[i]);
  }
  hyper_ = hyper.clone();
  shard_.reset();
  if (kept.empty()) return;  // more ranks than parameters
  shard_ = make_(kept);
  shard_->param_groups()[0].set_options(hyper_->clone());
  using StateMap = std::decay_t<decltype(shard_->state())>;
  for (auto& [index, state] : states) {
    shard_->state()[detail::optimizer_state_key<StateMap>(params_[index])] = std::move(state);
  }
}

void ZeroRedundancyOptimizer::zero_grad() { detail::zero_gradients_in_place(params_); }

void ZeroRedundancyOptimizer::step() {
  update();
  share();
}

void ZeroRedundancyOptimizer::update() {
  torch::NoGradGuard no_grad;
  if (shard_) shard_->step();
}

void ZeroRedundancyOptimizer::share() {
  ProcessGroup& group = process_group();
  // Every owner's parameters to everyone, all broadcasts in flight at once; detached, since
  // the backend writes into them on its own thread, where grad mode is on.
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < group.size(); ++r) {
    if (owned_[r].empty()) continue;
    std::vector<at::Tensor> tensors;
    int64_t bytes = 0;
    for (const at::Tensor& p : owned_[r]) {
      tensors.push_back(p.detach());
      bytes += static_cast<int64_t>(p.nbytes());
    }
    const trace::detail::CollectiveLabel label("zero shard", r, bytes);
    works.push_back(group.broadcast_coalesced(std::move(tensors), r));
  }
  for (auto& w : works) w->wait();
}

void ZeroRedundancyOptimizer::reshard(std::shared_ptr<ProcessGroup> group, const std::vector<int>& source,
                                      const std::function<bool(int rank, size_t index)>& has) {
  DATAPAR_CHECK(group != nullptr, "ZeroRedundancyOptimizer::reshard: the group is null.");
  const size_t n = params_.size();
  DATAPAR_CHECK(source.size() == n, "ZeroRedundancyOptimizer::reshard: ", source.size(), " sources for ", n,
                " parameters.");
  const Kind kind = optimizer_kind(*make_({params_.front()}));
  DATAPAR_CHECK(kind != Kind::kOther, "ZeroRedundancyOptimizer::reshard: supports SGD, Adam and AdamW, not ",
                detail::optimizer_kind_name(kind), ".");
  const int size = group->size(), me = group->rank();
  const std::vector<int> owners = detail::balanced_owners(params_, size);
  // Each state moves when a new keeper lacks it; every value moves, from the same rank.
  detail::ParamStateMoves moves{source, std::vector<bool>(n, false), std::vector<bool>(n, true),
                                std::vector<bool>(n, false)};
  for (size_t i = 0; i < n; ++i) {
    DATAPAR_CHECK(source[i] >= 0 && source[i] < size, "ZeroRedundancyOptimizer::reshard: parameter ", i,
                  "'s source is rank ", source[i], " of ", size, ".");
    for (int r = 0; r < size; ++r) {
      if (keeper(owners, i, r, size) && !has(r, i)) moves.state[i] = true;
    }
    moves.keep[i] = keeper(owners, i, me, size) && !has(me, i);
  }
  auto received =
      detail::broadcast_param_states(*group, kind, params_, moves, [&](size_t i) { return kept_state(i); });
  // What this rank keeps now: its own where it has it, or what it received.
  std::map<size_t, std::unique_ptr<optim::OptimizerParamState>> states;
  using StateMap = std::decay_t<decltype(shard_->state())>;
  for (size_t i = 0; i < n; ++i) {
    if (!keeper(owners, i, me, size)) continue;
    if (has(me, i)) {
      auto it = shard_->state().find(detail::optimizer_state_key<StateMap>(params_[i]));
      if (it != shard_->state().end()) states[i] = std::move(it->second);
    } else if (received.count(i)) {
      states[i] = std::move(received[i]);
    }
  }
  group_ = std::move(group);
  owner_ = owners;
  owned_.assign(size, {});
  for (size_t i = 0; i < n; ++i) {
    owned_[owners[i]].push_back(params_[i]);
    keeps_[i] = keeper(owners, i, me, size);
  }
  rebuild(std::move(states), shard_ ? shard_->param_groups()[0].options() : *hyper_);
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  if (!shard_) return 0;
  const Kind kind = optimizer_kind(*shard_);
  int64_t bytes = 0;
  for (const auto& entry : shard_->state()) {
    for (const at::Tensor& t : param_state_tensors(kind, *entry.second)) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::consolidate(int to) {
  ProcessGroup& group = process_group();
  DATAPAR_CHECK(to >= 0 && to < group.size(), "ZeroRedundancyOptimizer::consolidate: rank ", to, " is outside [0, ",
                group.size(), ").");
  // Every rank learns the kind alike, even one that keeps nothing: from an optimizer over one
  // parameter, which holds no state yet.
  const Kind kind = optimizer_kind(*make_({params_.front()}));
  DATAPAR_CHECK(kind != Kind::kOther, "ZeroRedundancyOptimizer::consolidate: supports SGD, Adam and AdamW, not ",
                detail::optimizer_kind_name(kind), ".");
  const bool here = group.rank() == to;
  // Each state from its owner, unless `to` keeps it: then `to` copies its own, so that the
  // two optimizers share nothing.
  const size_t n = params_.size();
  detail::ParamStateMoves moves{owner_, std::vector<bool>(n), std::vector<bool>(n, false),
                                std::vector<bool>(n, here)};
  for (size_t i = 0; i < n; ++i) moves.state[i] = !keeper(owner_, i, to, group.size());
  auto received =
      detail::broadcast_param_states(group, kind, params_, moves, [&](size_t i) { return kept_state(i); });
  if (!here) return nullptr;
  std::unique_ptr<optim::Optimizer> full = make_(params_);
  full->param_groups()[0].set_options((shard_ ? shard_->param_groups()[0].options() : *hyper_).clone());
  using StateMap = std::decay_t<decltype(full->state())>;
  for (size_t i = 0; i < n; ++i) {
    const optim::OptimizerParamState* mine = kept_state(i);
    if (mine != nullptr) {
      full->state()[detail::optimizer_state_key<StateMap>(params_[i])] = detail::copy_param_state(kind, *mine);
    } else if (received.count(i)) {
      full->state()[detail::optimizer_state_key<StateMap>(params_[i])] = std::move(received[i]);
    }
  }
  return full;
}

void ZeroRedundancyOptimizer::load_full_state(const optim::Optimizer& full) {
  const Kind kind = optimizer_kind(full);
  DATAPAR_CHECK(kind != Kind::kOther, "ZeroRedundancyOptimizer::load_full_state: supports SGD, Adam and AdamW.");
  DATAPAR_CHECK(full.param_groups().size() == 1 && full.param_groups()[0].params().size() == params_.size(),
                "ZeroRedundancyOptimizer::load_full_state: the optimizer must hold the ", params_.size(),
                " parameters of this one in one group; it has ", full.param_groups().size(), " group(s) with ",
                full.param_groups().empty() ? 0 : full.param_groups()[0].params().size(), " parameters in the first.");
  const Kind mine = optimizer_kind(*make_({params_.front()}));
  DATAPAR_CHECK(mine == kind, "ZeroRedundancyOptimizer::load_full_state: the optimizer is ",
                detail::optimizer_kind_name(kind), ", this one's shards are ", detail::optimizer_kind_name(mine), ".");
  const auto& theirs = full.param_groups()[0].params();
  using StateMap = std::decay_t<decltype(full.state())>;
  std::map<size_t, std::unique_ptr<optim::OptimizerParamState>> states;
  for (size_t i = 0; i < params_.size(); ++i) {
    DATAPAR_CHECK(theirs[i].sizes() == params_[i].sizes(), "ZeroRedundancyOptimizer::load_full_state: parameter ", i,
                  " is ", theirs[i].sizes(), " there and ", params_[i].sizes(), " here.");
    if (!keeps_[i]) continue;
    // Keyed by `full`'s own parameter i, stored under ours: the same tensor or its twin.
    const auto it = full.state().find(detail::optimizer_state_key<StateMap>(theirs[i]));
    if (it == full.state().end()) continue;
    std::unique_ptr<optim::OptimizerParamState> copy = detail::copy_param_state(kind, *it->second);
    for (const at::Tensor& t : param_state_tensors(kind, *copy)) {
      DATAPAR_CHECK(t.sizes() == params_[i].sizes(), "ZeroRedundancyOptimizer::load_full_state: parameter ", i,
                    "'s state is ", t.sizes(), ", the parameter ", params_[i].sizes(), ".");
    }
    states[i] = std::move(copy);
  }
  rebuild(std::move(states), full.param_groups()[0].options());
}

}  // namespace datapar
