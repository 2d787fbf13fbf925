// ShardedOptimizer. See datapar/ft/sharded_optimizer.h.
#include "datapar/ft/sharded_optimizer.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <sstream>
#include <type_traits>

#include "datapar/error.h"
#include "datapar/ft/epoch.h"
#include "ft/standings.h"
#include "optim/broadcast_param_states.h"
#include "optim/param_state.h"
#include "optim/state_key.h"
#include "trace/recorder.h"

namespace datapar::ft {
namespace {

namespace optim = torch::optim;
using datapar::detail::OptimizerKind;
using datapar::detail::str_cat;

std::string shape(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(std::vector<at::Tensor> params, Factory make)
    : params_(std::move(params)), make_(std::move(make)) {
  DATAPAR_CHECK(!params_.empty(), "ft::ShardedOptimizer: no parameters to optimize.");
  DATAPAR_CHECK(make_ != nullptr, "ft::ShardedOptimizer: the optimizer factory is empty.");
  optimizer_ = make_(params_);
  DATAPAR_CHECK(optimizer_ != nullptr && optimizer_->param_groups().size() == 1,
                "ft::ShardedOptimizer: the factory must return an optimizer with exactly the parameters it is handed, "
                "as one group.");
  const OptimizerKind kind = datapar::detail::optimizer_kind(*optimizer_);
  DATAPAR_CHECK(kind != OptimizerKind::kOther, "ft::ShardedOptimizer: supports SGD, Adam and AdamW, whose state ",
                "it can move between members; the factory made ", datapar::detail::optimizer_kind_name(kind), ".");
  kind_ = static_cast<int>(kind);
  keeps_.assign(params_.size(), true);
  options_ = optimizer_->param_groups()[0].options().clone();
}

ShardedOptimizer::~ShardedOptimizer() = default;

const optim::OptimizerParamState* ShardedOptimizer::kept_state(size_t index) const {
  if (!optimizer_ || !keeps_[index]) return nullptr;
  using StateMap = std::decay_t<decltype(optimizer_->state())>;
  const auto it = optimizer_->state().find(datapar::detail::optimizer_state_key<StateMap>(params_[index]));
  return it == optimizer_->state().end() ? nullptr : it->second.get();
}

void ShardedOptimizer::rebuild(std::map<size_t, std::unique_ptr<optim::OptimizerParamState>> states) {
  std::vector<at::Tensor> kept;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (keeps_[i]) kept.push_back(params_[i]);
  }
  optimizer_.reset();
  if (kept.empty()) return;  // more members than parameters
  optimizer_ = make_(kept);
  optimizer_->param_groups()[0].set_options(options_->clone());
  using StateMap = std::decay_t<decltype(optimizer_->state())>;
  for (auto& [index, state] : states) {
    optimizer_->state()[datapar::detail::optimizer_state_key<StateMap>(params_[index])] = std::move(state);
  }
}

void ShardedOptimizer::load_full_state(const optim::Optimizer& full) {
  const auto kind = static_cast<OptimizerKind>(kind_);
  DATAPAR_CHECK(datapar::detail::optimizer_kind(full) == kind, "ft::ShardedOptimizer::load_full_state: the optimizer ",
                "is ", datapar::detail::optimizer_kind_name(datapar::detail::optimizer_kind(full)), ", this one ",
                datapar::detail::optimizer_kind_name(kind), ".");
  DATAPAR_CHECK(full.param_groups().size() == 1 && full.param_groups()[0].params().size() == params_.size(),
                "ft::ShardedOptimizer::load_full_state: the optimizer must hold the ", params_.size(),
                " parameters of this one in one group.");
  const auto& theirs = full.param_groups()[0].params();
  using StateMap = std::decay_t<decltype(full.state())>;
  std::map<size_t, std::unique_ptr<optim::OptimizerParamState>> states;
  for (size_t i = 0; i < params_.size(); ++i) {
    DATAPAR_CHECK(theirs[i].sizes() == params_[i].sizes(), "ft::ShardedOptimizer::load_full_state: parameter ", i,
                  " is ", theirs[i].sizes(), " there and ", params_[i].sizes(), " here.");
    const auto it = full.state().find(datapar::detail::optimizer_state_key<StateMap>(theirs[i]));
    if (it != full.state().end()) states[i] = datapar::detail::copy_param_state(kind, *it->second);
  }
  keeps_.assign(params_.size(), true);
  owner_.clear();
  options_ = full.param_groups()[0].options().clone();
  rebuild(std::move(states));
}

void ShardedOptimizer::zero_grad() { datapar::detail::zero_gradients_in_place(params_); }

void ShardedOptimizer::update() {
  torch::NoGradGuard no_grad;
  if (optimizer_) optimizer_->step();
}

void ShardedOptimizer::share(ProcessGroup& group) {
  DATAPAR_CHECK(!owner_.empty(), "ft::ShardedOptimizer::share: reshard() over the group first.");
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < group.size(); ++r) {
    std::vector<at::Tensor> tensors;
    int64_t bytes = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != r) continue;
      tensors.push_back(params_[i].detach());  // the backend writes on its own thread
      bytes += static_cast<int64_t>(params_[i].nbytes());
    }
    if (tensors.empty()) continue;
    const trace::detail::CollectiveLabel label("zero shard", r, bytes);
    works.push_back(group.broadcast_coalesced(std::move(tensors), r));
  }
  for (auto& w : works) w->wait();
}

ShardedOptimizer::Resharded ShardedOptimizer::reshard(ProcessGroup& group, Standing& mine) {
  const int n = group.size(), me = group.rank();
  const size_t params = params_.size();
  // Every member's standing, and which parameters' state it keeps.
  std::vector<int64_t> kept(params);
  for (size_t i = 0; i < params; ++i) kept[i] = keeps_[i] ? 1 : 0;
  const detail::Standings standings(group, mine, kept);
  if (standings.applies_missed_vote(me)) {  // at once in `mine`: a failure below must not apply it twice
    update();
    mine = {standings.step(me), mine.voted_epoch, -1, 0};
  }
  const int64_t newest = standings.newest();
  auto has = [&](int r, size_t i) { return standings.step(r) == newest && standings.extra(r, i) == 1; };

  // The new owners, as ZeRO-1's; each shard kept by its owner and the next rank. This
  // member's own change only once every move succeeded: until then it keeps what it kept.
  const std::vector<int> owners = datapar::detail::balanced_owners(params_, n);
  auto keeper = [&](size_t i, int r) { return r == owners[i] || r == (owners[i] + 1) % n; };
  datapar::detail::ParamStateMoves moves{std::vector<int>(params, -1), std::vector<bool>(params, false),
                                         std::vector<bool>(params, true), std::vector<bool>(params, false)};
  for (size_t i = 0; i < params; ++i) {
    for (int r = 0; r < n && moves.source[i] < 0; ++r) {
      if (has(r, i)) moves.source[i] = r;
    }
    if (moves.source[i] < 0) {
      throw MembershipError(str_cat(
          "ft: no member has the optimizer state of parameter ", i, " (", shape(params_[i]), ") at step ", newest,
          ": both members that kept it left the job at once. The job cannot go on from memory.\n---> HINT: start it "
          "again from its last checkpoint (datapar launch ... --resume); a shard is kept by two neighbouring ranks, "
          "so one failure at a time loses nothing."));
    }
    for (int r = 0; r < n; ++r) {
      if (keeper(i, r) && !has(r, i)) moves.state[i] = true;
    }
    moves.keep[i] = keeper(i, me) && !has(me, i);
  }
  const auto kind = static_cast<OptimizerKind>(kind_);
  auto received = datapar::detail::broadcast_param_states(group, kind, params_, moves,
                                                          [&](size_t i) { return kept_state(i); });
  // What this member keeps now: its own where it was at the newest step, or what it received.
  std::map<size_t, std::unique_ptr<optim::OptimizerParamState>> states;
  using StateMap = std::decay_t<decltype(optimizer_->state())>;
  for (size_t i = 0; i < params; ++i) {
    if (!keeper(i, me)) continue;
    if (has(me, i)) {
      auto it = optimizer_->state().find(datapar::detail::optimizer_state_key<StateMap>(params_[i]));
      if (it != optimizer_->state().end()) states[i] = std::move(it->second);
    } else if (received.count(i)) {
      states[i] = std::move(received[i]);
    }
  }
  for (size_t i = 0; i < params; ++i) keeps_[i] = keeper(i, me);
  owner_ = owners;
  if (optimizer_) options_ = optimizer_->param_groups()[0].options().clone();
  rebuild(std::move(states));
  mine = {newest, mine.commit_epoch, -1, 0};
  return {newest, standings.first_at_newest()};
}

std::unique_ptr<optim::Optimizer> ShardedOptimizer::consolidate(ProcessGroup& group, int to) {
  DATAPAR_CHECK(!owner_.empty(), "ft::ShardedOptimizer::consolidate: reshard() over the group first.");
  DATAPAR_CHECK(to >= 0 && to < group.size(), "ft::ShardedOptimizer::consolidate: rank ", to, " is outside [0, ",
                group.size(), ").");
  const auto kind = static_cast<OptimizerKind>(kind_);
  const size_t params = params_.size();
  const bool here = group.rank() == to;
  // Each state from its owner, unless `to` keeps it: then `to` copies its own.
  const int n = group.size();
  datapar::detail::ParamStateMoves moves{owner_, std::vector<bool>(params), std::vector<bool>(params, false),
                                         std::vector<bool>(params, here)};
  for (size_t i = 0; i < params; ++i) moves.state[i] = to != owner_[i] && to != (owner_[i] + 1) % n;
  auto received = datapar::detail::broadcast_param_states(group, kind, params_, moves,
                                                          [&](size_t i) { return kept_state(i); });
  if (!here) return nullptr;
  std::unique_ptr<optim::Optimizer> full = make_(params_);
  full->param_groups()[0].set_options((optimizer_ ? optimizer_->param_groups()[0].options() : *options_).clone());
  using StateMap = std::decay_t<decltype(full->state())>;
  for (size_t i = 0; i < params; ++i) {
    const optim::OptimizerParamState* mine = kept_state(i);
    if (mine != nullptr) {
      full->state()[datapar::detail::optimizer_state_key<StateMap>(params_[i])] =
          datapar::detail::copy_param_state(kind, *mine);
    } else if (received.count(i)) {
      full->state()[datapar::detail::optimizer_state_key<StateMap>(params_[i])] = std::move(received[i]);
    }
  }
  return full;
}

int64_t ShardedOptimizer::state_bytes() const {
  if (!optimizer_) return 0;
  int64_t bytes = 0;
  for (const auto& entry : optimizer_->state()) {
    for (const at::Tensor& t : datapar::detail::param_state_tensors(static_cast<OptimizerKind>(kind_), *entry.second)) {
      bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

}  // namespace datapar::ft
