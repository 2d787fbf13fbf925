// FsdpReplicas: FaultTolerantFsdp's shards under HSDP. See datapar/ft/fault_tolerant_fsdp.h.
//
// Note [Shards from the matching rank]
// In replica groups of k members (FtOptions::replica_group_size) a member's index in its
// group is its slot's, which a restarted process takes over, and the decider puts whole
// groups in slot order, so rank r of any epoch keeps shard r % k of every unit, in the same
// layout (k never changes). Every replica group at the newest step holds the whole state,
// so nothing is re-sharded: a member behind (a replacement, or the rest of a group that
// left) takes each unit's shard and its optimizer state from the first member at the newest
// step with its index, one unit in flight at a time, keeping the state as views of what it
// received; members at the newest step copy their parameters' shards into the new epoch's
// FSDP and hand it their optimizer state's tensors (not copies: a member that regroups holds
// its shards twice at most, never its optimizer state). A group that lost a member waits whole (the decider), so the other groups' members
// keep no copy of anyone else's shard: a member holds its own shards only. Only when every
// group that kept some index at the newest step is gone is a shard lost: the job stops.
#include "datapar/ft/fault_tolerant_fsdp.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "datapar/error.h"
#include "datapar/ft/membership/membership.h"
#include "ft/fsdp_state_moves.h"
#include "ft/standings.h"
#include "optim/param_state.h"

namespace datapar::ft::detail {
namespace {

using datapar::detail::OptimizerKind;
using datapar::detail::str_cat;
namespace optim = torch::optim;

constexpr int kMetaTag = 1, kShardTag = 2;

}  // namespace

struct FsdpReplicas::Impl {
  int shard_size = 1;
  OptimizerKind kind = OptimizerKind::kOther;
  // Before the first epoch: the whole state; after, the shards of index `index`.
  bool whole = true;
  StateDict model;
  OptimizerState optimizer{c10::AnyType::get(), c10::AnyType::get()};
  int index = -1;
  at::Tensor none;  // kept_gradients(): nothing besides its own

  // Unit `unit`'s shard and state into `next`: this member's own from `current` (at the
  // newest step), or from `source` (behind); and from this member to those behind that
  // take theirs from it.
  void move_unit(ProcessGroup& group, const Standings& standings, const std::vector<int>& source, size_t unit,
                 const FsdpParts* current, const FsdpParts& next) const;
};

FsdpReplicas::FsdpReplicas(int shard_size, StateDict model, OptimizerState optimizer)
    : impl_(std::make_unique<Impl>()) {
  DATAPAR_CHECK(shard_size >= 1, "ft::FaultTolerantFsdp: replica groups of ", shard_size, " members.");
  impl_->shard_size = shard_size;
  impl_->model = std::move(model);
  impl_->optimizer = std::move(optimizer);
}

FsdpReplicas::~FsdpReplicas() = default;

const at::Tensor& FsdpReplicas::kept_gradients() const { return impl_->none; }

void FsdpReplicas::Impl::move_unit(ProcessGroup& group, const Standings& standings, const std::vector<int>& source,
                                   size_t unit, const FsdpParts* current, const FsdpParts& next) const {
  const int me = group.rank(), k = shard_size;
  const int64_t newest = standings.newest();
  const at::Tensor& into = next.shards[unit];
  const torch::NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> sent;
  if (standings.step(me) == newest) {
    const at::Tensor& own = current->shards.at(unit);
    into.detach().copy_(own);
    const optim::OptimizerParamState* state = state_of(*current->optimizer, own);
    if (state != nullptr) {  // the same tensors: the epoch before's goes once this one is made
      set_state(*next.optimizer, into,
                datapar::detail::make_param_state(kind, datapar::detail::param_state_meta(kind, state),
                                                  datapar::detail::param_state_tensors(kind, *state)));
    }
    if (source[static_cast<size_t>(me % k)] != me) return;
    // To each member behind with this index, the shard and its state side by side.
    const datapar::detail::ParamStateMeta meta = datapar::detail::param_state_meta(kind, state);
    const at::Tensor header = at::tensor({meta[0], meta[1], meta[2]}, at::kLong);
    std::vector<at::Tensor> pieces = {own.detach().reshape({-1})};
    if (state != nullptr) {
      for (const at::Tensor& t : datapar::detail::param_state_tensors(kind, *state)) pieces.push_back(t.reshape({-1}));
    }
    const at::Tensor payload = at::cat(pieces);
    for (int r = 0; r < standings.size(); ++r) {
      if (r % k != me % k || standings.step(r) == newest) continue;
      sent.push_back(group.send(header, r, kMetaTag));
      sent.push_back(group.send(payload, r, kShardTag));
    }
    for (const std::shared_ptr<Work>& w : sent) w->wait();
    return;
  }
  const int from = source[static_cast<size_t>(me % k)];
  const at::Tensor header = at::empty({3}, at::kLong);
  group.recv(header, from, kMetaTag)->wait();
  const datapar::detail::ParamStateMeta meta = {header[0].item<int64_t>(), header[1].item<int64_t>(),
                                                header[2].item<int64_t>()};
  const int64_t numel = into.numel();
  const auto count = static_cast<int64_t>(datapar::detail::param_state_tensor_count(kind, meta));
  DATAPAR_CHECK(count >= 0 && count <= 3, "ft::FaultTolerantFsdp: member ", from, " sent a shard with ", count,
                " state tensors.");
  const at::Tensor payload = at::empty({numel * (1 + count)}, into.options());
  group.recv(payload, from, kShardTag)->wait();
  into.detach().copy_(payload.narrow(0, 0, numel).view(into.sizes()));
  if (meta[0] == 0) return;
  std::vector<at::Tensor> tensors;  // views of what was received: no second copy
  for (int64_t t = 0; t < count; ++t) tensors.push_back(payload.narrow(0, numel * (t + 1), numel).view(into.sizes()));
  set_state(*next.optimizer, into, datapar::detail::make_param_state(kind, meta, tensors));
}

int64_t FsdpReplicas::rebuild(ProcessGroup& group, int64_t /*epoch*/, Standing& mine, const FsdpParts* current,
                              const FsdpParts& next, const std::function<void()>& apply_missed_vote) {
  Impl& m = *impl_;
  if (m.kind == OptimizerKind::kOther) m.kind = movable_kind(*next.optimizer);
  const int me = group.rank(), k = m.shard_size;
  const Standings standings(group, mine, {m.whole ? 1 : 0, m.index});
  if (standings.applies_missed_vote(me) && current) {  // Note [A voted step whose outcome a member missed]
    const torch::NoGradGuard no_grad;
    apply_missed_vote();
    mine = {standings.step(me), mine.voted_epoch, -1, 0};
  }
  const int64_t newest = standings.newest();
  int whole = -1;
  std::vector<int> source(static_cast<size_t>(k), -1);  // for each index, the first member at the newest step
  for (int r = 0; r < standings.size(); ++r) {
    if (standings.step(r) != newest) continue;
    if (standings.kept(r, 0) == 1) {
      if (whole < 0) whole = r;
      continue;
    }
    const int64_t index = standings.kept(r, 1);
    DATAPAR_CHECK(index == r % k, "ft::FaultTolerantFsdp: member ", r, " keeps the shards of index ", index,
                  " in its replica group, not ", r % k, " (its slot's).");
    if (source[static_cast<size_t>(index)] < 0) source[static_cast<size_t>(index)] = r;
  }
  if (whole >= 0) {
    load_whole_state(group, whole, m.model, m.optimizer, next);
  } else {
    for (int index = 0; index < k; ++index) {
      if (source[static_cast<size_t>(index)] >= 0) continue;
      throw MembershipError(str_cat(
          "ft: no replica group keeps shard ", index, " of ", k, " of the model at step ", newest, ": every member ",
          "that had it left the job, and with them that part of the parameters and optimizer state. The job cannot "
          "go on from memory.\n---> HINT: start it again from its last checkpoint (datapar launch ... --resume); "
          "each shard is kept by every replica group, so the job survives as long as one group stays whole."));
    }
    DATAPAR_CHECK(standings.step(me) < newest || current != nullptr,
                  "ft::FaultTolerantFsdp: a member at the newest step without its shards.");
    for (size_t u = 0; u < next.shards.size(); ++u) m.move_unit(group, standings, source, u, current, next);
    if (current) next.optimizer->param_groups()[0].set_options(current->optimizer->param_groups()[0].options().clone());
    take_buffers(group, standings.first_at_newest(), current, next);  // BatchNorm's statistics
  }
  m.whole = false;
  m.model = StateDict();
  m.optimizer = OptimizerState(c10::AnyType::get(), c10::AnyType::get());
  m.index = me % k;
  mine = {newest, mine.commit_epoch, -1, 0};
  return newest;
}

}  // namespace datapar::ft::detail
