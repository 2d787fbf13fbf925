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
#include "collectives/coalesce.h"
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
    : params_(std::move(params)), make_(std::move(make)), group_(group ? std::move(group) : default_group()) {
  DATAPAR_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameters to optimize.");
  DATAPAR_CHECK(make_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory is empty.");
  const int world = group_->size();
  owner_ = detail::balanced_owners(params_, world);
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

void ZeroRedundancyOptimizer::zero_grad() { detail::zero_gradients_in_place(params_); }

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
  const Kind kind = optimizer_kind(*shard_);
  int64_t bytes = 0;
  for (const auto& entry : shard_->state()) {
    for (const at::Tensor& t : param_state_tensors(kind, *entry.second)) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

std::unique_ptr<optim::Optimizer> ZeroRedundancyOptimizer::consolidate(int to) {
  DATAPAR_CHECK(to >= 0 && to < group_->size(), "ZeroRedundancyOptimizer::consolidate: rank ", to,
                " is outside [0, ", group_->size(), ").");
  // Every rank learns the kind alike, even one that owns nothing: from an optimizer over one
  // parameter, which holds no state yet.
  const Kind kind = optimizer_kind(*make_({params_.front()}));
  DATAPAR_CHECK(kind != Kind::kOther, "ZeroRedundancyOptimizer::consolidate: supports SGD, Adam and AdamW, not ",
                detail::optimizer_kind_name(kind), ".");
  const int rank = group_->rank();
  std::unique_ptr<optim::Optimizer> full;
  using StateMap = std::decay_t<decltype(shard_->state())>;
  if (rank == to) {
    full = make_(params_);
    if (shard_) full->param_groups()[0].set_options(shard_->param_groups()[0].options().clone());
  }
  // Each owner's states to `to`, which keeps them; its own it copies, so that the two
  // optimizers share nothing.
  const size_t n = params_.size();
  detail::ParamStateMoves moves{owner_, std::vector<bool>(n), std::vector<bool>(n, false),
                                std::vector<bool>(n, rank == to)};
  for (size_t i = 0; i < n; ++i) moves.state[i] = owner_[i] != to;
  auto held = [&](size_t i) -> const optim::OptimizerParamState* {
    auto it = shard_->state().find(detail::optimizer_state_key<StateMap>(params_[i]));
    return it == shard_->state().end() ? nullptr : it->second.get();
  };
  auto received = detail::broadcast_param_states(*group_, kind, params_, moves, held);
  if (rank != to) return full;
  for (size_t i = 0; i < n; ++i) {
    const optim::OptimizerParamState* mine = owner_[i] == to ? held(i) : nullptr;
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
  if (!shard_) return;
  DATAPAR_CHECK(optimizer_kind(*shard_) == kind, "ZeroRedundancyOptimizer::load_full_state: the optimizer is ",
                detail::optimizer_kind_name(kind), ", this one's shards are ",
                detail::optimizer_kind_name(optimizer_kind(*shard_)), ".");
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
    std::unique_ptr<optim::OptimizerParamState> copy = detail::copy_param_state(kind, *it->second);
    for (const at::Tensor& t : param_state_tensors(kind, *copy)) {
      DATAPAR_CHECK(t.sizes() == params_[i].sizes(), "ZeroRedundancyOptimizer::load_full_state: parameter ", i,
                    "'s state is ", t.sizes(), ", the parameter ", params_[i].sizes(), ".");
    }
    shard_->state()[detail::optimizer_state_key<StateMap>(params_[i])] = std::move(copy);
  }
}

}  // namespace datapar
