// FsdpTwoCopies: the non-template part of FaultTolerantFsdp. See datapar/ft/fault_tolerant_fsdp.h.
//
// Note [An FSDP shard's layout]
// A unit's parameters are one flat buffer, zero-padded to a multiple of the group's size n;
// rank r's shard is its r-th n-th. The flat order does not depend on n, only the padding
// does, so a unit's whole flat (its shards side by side) is the same in any layout up to
// the zeros at its end: the shards of one layout are put side by side and cut again for
// another. The padding stays zero through training (its gradient is zero, and so is every
// update SGD, Adam and AdamW make of a zero gradient on a zero parameter with zero state).
//
// Note [The previous rank's gradient shard]
// Each rank keeps the previous rank's shard and updates it on a commit, so it needs that
// rank's gradient shard too. It has it at no cost: every member's gradient of each slice
// reaches every member unit by unit (ShardedSliceGradients, for gradients that do not
// depend on who is alive), and each keeps two shards of it instead of one. (Before, each
// rank's reduced shard went to the next by an all-gather per unit: gloo's send and receive,
// which would move just that, go over TCP even between processes of one machine.)
//
// Note [Re-sharding unit by unit]
// After a membership change each member takes its shard of the new layout from the members
// that keep the old one's. Each unit is put together whole (its flat parameters and state
// tensors, broadcast shard by shard from their keepers), cut for the new layout and freed
// before the next: a member holds its old shards, the previous rank's it kept, its new
// shards and one unit whole at the most, never the whole model (before, every member put
// every unit together at once: the memory FSDP exists to avoid, when a job is in trouble).
#include "datapar/ft/fault_tolerant_fsdp.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <string>
#include <type_traits>

#include "datapar/error.h"
#include "datapar/ft/membership/membership.h"
#include "datapar/process_group/metadata.h"
#include "ft/fsdp_state_moves.h"
#include "ft/standings.h"
#include "optim/broadcast_param_states.h"
#include "optim/param_state.h"

namespace datapar::ft::detail {
namespace {

namespace optim = torch::optim;
using datapar::detail::OptimizerKind;
using datapar::detail::str_cat;

// What a member keeps, as the members exchange it in their standings.
struct Kept {
  bool whole = false;         // the whole state (it has not trained yet), or
  int64_t layout_epoch = 0;   // the shards of a layout (Note [An FSDP shard's layout])
  int64_t layout_size = 0;
  int64_t layout_rank = -1;

  std::vector<int64_t> columns() const { return {whole ? 1 : 0, layout_epoch, layout_size, layout_rank}; }
  static Kept of(const Standings& standings, int rank) {
    return {standings.kept(rank, 0) == 1, standings.kept(rank, 1), standings.kept(rank, 2), standings.kept(rank, 3)};
  }
};

// Elements [begin, begin + length) of `flat` in a new tensor, zeros past its end (another
// layout's padding).
at::Tensor part_of(const at::Tensor& flat, int64_t begin, int64_t length) {
  at::Tensor out = at::zeros({length}, flat.options());
  const int64_t n = std::max<int64_t>(0, std::min(length, flat.numel() - begin));
  if (n > 0) out.narrow(0, 0, n).copy_(flat.narrow(0, begin, n));
  return out;
}

}  // namespace

struct FsdpTwoCopies::Impl {
  OptimizerFactory make_optimizer;
  OptimizerKind kind = OptimizerKind::kOther;
  // Before the first epoch: the whole state.
  bool whole = true;
  StateDict model;
  OptimizerState optimizer{c10::AnyType::get(), c10::AnyType::get()};
  // After: the layout of the shards kept (Note [An FSDP shard's layout]), and the previous
  // rank's shard: its parameters (one flat per unit), their optimizer and gradients.
  int64_t layout_epoch = 0;
  int layout_size = 0, layout_rank = -1;
  std::vector<at::Tensor> kept;
  std::unique_ptr<optim::Optimizer> kept_optimizer;
  at::Tensor kept_gradients;  // the kept shards' gradients side by side

  // One unit's whole flat in one layout, its optimizer state tensors and the state's
  // metadata, put together from the members that keep each of its shards.
  struct UnitWhole {
    at::Tensor params;
    std::vector<at::Tensor> state;
    datapar::detail::ParamStateMeta meta{0, 0, 0};
  };
  // For each shard of `layout`, the member that gives it: its owner if at the newest step,
  // else the next rank, which keeps it too.
  std::vector<int> keepers(const Standings& standings, int64_t layout) const;
  UnitWhole gather(ProcessGroup& group, const std::vector<int>& keeper, size_t unit, const FsdpParts* current,
                   const FsdpParts& next) const;
  // Rank `rank`'s shard of `whole` (unit `unit`) into `next`, the new layout's padding zeros
  // past the flat (Note [An FSDP shard's layout]).
  void fill(const UnitWhole& whole, int rank, size_t unit, const FsdpParts& next) const;
  void keep_previous(ProcessGroup& group, const FsdpParts& next);
};

FsdpTwoCopies::FsdpTwoCopies(OptimizerFactory make_optimizer, StateDict model, OptimizerState optimizer)
    : impl_(std::make_unique<Impl>()) {
  DATAPAR_CHECK(make_optimizer != nullptr, "ft::FaultTolerantFsdp: the optimizer factory is empty.");
  impl_->make_optimizer = std::move(make_optimizer);
  impl_->model = std::move(model);
  impl_->optimizer = std::move(optimizer);
}

FsdpTwoCopies::~FsdpTwoCopies() = default;

std::vector<int> FsdpTwoCopies::Impl::keepers(const Standings& standings, int64_t layout) const {
  const int64_t newest = standings.newest();
  int size = 0;
  for (int r = 0; r < standings.size(); ++r) {
    const Kept kept = Kept::of(standings, r);
    if (standings.step(r) == newest && kept.layout_epoch == layout) size = static_cast<int>(kept.layout_size);
  }
  std::vector<int> keeper(static_cast<size_t>(size), -1);
  for (int j = 0; j < size; ++j) {
    for (const int rank_in_layout : {j, (j + 1) % size}) {
      for (int r = 0; r < standings.size() && keeper[j] < 0; ++r) {
        const Kept kept = Kept::of(standings, r);
        if (standings.step(r) == newest && kept.layout_epoch == layout && kept.layout_rank == rank_in_layout) {
          keeper[j] = r;
        }
      }
    }
  }
  return keeper;
}

FsdpTwoCopies::Impl::UnitWhole FsdpTwoCopies::Impl::gather(ProcessGroup& group, const std::vector<int>& keeper,
                                                           size_t unit, const FsdpParts* current,
                                                           const FsdpParts& next) const {
  const int me = group.rank();
  const int size = static_cast<int>(keeper.size());
  // The unit's flat is the same in every layout (the same model), shard by shard from its
  // keeper, received in place, with its state.
  const int64_t shard = (next.unit_numels[unit] + size - 1) / size;
  UnitWhole whole;
  whole.params = at::zeros({shard * size}, next.shards[unit].options());
  std::vector<at::Tensor> slots;  // shard j at j
  datapar::detail::ParamStateMoves moves;
  std::vector<const optim::OptimizerParamState*> mine;
  for (int j = 0; j < size; ++j) {
    const bool here = me == keeper[j];
    if (here) {  // its own shard, or the previous rank's it kept
      const bool own = layout_rank == j;
      const at::Tensor& source = own ? current->shards.at(unit) : kept.at(unit);
      slots.push_back(source.detach());
      mine.push_back(state_of(own ? *current->optimizer : *kept_optimizer, source));
    } else {
      slots.push_back(whole.params.narrow(0, j * shard, shard));
      mine.push_back(nullptr);
    }
    moves.source.push_back(keeper[j]);
    moves.state.push_back(true);
    moves.value.push_back(true);
    moves.keep.push_back(!here);
  }
  auto received = datapar::detail::broadcast_param_states(group, kind, slots, moves, [&](size_t i) { return mine[i]; });
  for (int j = 0; j < size; ++j) {
    const size_t i = static_cast<size_t>(j);
    const bool here = me == keeper[j];
    if (here) whole.params.narrow(0, j * shard, shard).copy_(slots[i]);
    const optim::OptimizerParamState* state = here ? mine[i] : (received.count(i) ? received[i].get() : nullptr);
    if (state == nullptr) continue;
    const std::vector<at::Tensor> tensors = datapar::detail::param_state_tensors(kind, *state);
    if (whole.state.empty()) {
      whole.meta = datapar::detail::param_state_meta(kind, state);
      for (const at::Tensor& t : tensors) whole.state.push_back(at::zeros({shard * size}, t.options()));
    }
    for (size_t t = 0; t < tensors.size() && t < whole.state.size(); ++t) {
      whole.state[t].narrow(0, j * shard, shard).copy_(tensors[t]);
    }
  }
  return whole;
}

void FsdpTwoCopies::Impl::fill(const UnitWhole& whole, int rank, size_t unit, const FsdpParts& next) const {
  const torch::NoGradGuard no_grad;
  const int64_t shard = next.shards[unit].numel();
  next.shards[unit].detach().copy_(part_of(whole.params, rank * shard, shard));
  if (whole.state.empty()) return;
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& t : whole.state) tensors.push_back(part_of(t, rank * shard, shard));
  set_state(*next.optimizer, next.shards[unit], datapar::detail::make_param_state(kind, whole.meta, tensors));
}

void FsdpTwoCopies::Impl::keep_previous(ProcessGroup& group, const FsdpParts& next) {
  const int n = group.size(), rank = group.rank();
  if (n == 1) {  // its own shard is the whole model
    kept.clear();
    kept_optimizer.reset();
    kept_gradients = at::Tensor();
    return;
  }
  // Unit by unit, this rank's shard and its state side by side to the next rank, the
  // previous rank's from it (every rank's shards have the same sizes): a unit's shard in
  // flight at a time (Note [Re-sharding unit by unit]). The pieces received are views of
  // what was received, which they keep; only once all arrived does the shard kept before go
  // (a failure on the way keeps it).
  std::vector<at::Tensor> shards;
  std::vector<std::vector<at::Tensor>> states;
  std::vector<datapar::detail::ParamStateMeta> meta;
  for (const at::Tensor& s : next.shards) {
    std::vector<at::Tensor> mine = {s.detach().reshape({-1})};
    const optim::OptimizerParamState* state = state_of(*next.optimizer, s);
    meta.push_back(datapar::detail::param_state_meta(kind, state));
    if (state != nullptr) {
      for (const at::Tensor& t : datapar::detail::param_state_tensors(kind, *state)) mine.push_back(t.reshape({-1}));
    }
    const at::Tensor out = at::cat(mine);
    const at::Tensor in = at::empty_like(out);
    auto sent = group.send(out, (rank + 1) % n);
    auto got = group.recv(in, (rank + n - 1) % n);
    sent->wait();
    got->wait();
    const int64_t numel = s.numel();
    shards.push_back(in.narrow(0, 0, numel).view(s.sizes()));
    states.emplace_back();
    for (size_t t = 0; t < datapar::detail::param_state_tensor_count(kind, meta.back()); ++t) {
      states.back().push_back(in.narrow(0, numel * static_cast<int64_t>(t + 1), numel).view(s.sizes()));
    }
  }
  std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(shards);
  optimizer->param_groups()[0].set_options(next.optimizer->param_groups()[0].options().clone());
  for (size_t u = 0; u < shards.size(); ++u) {
    if (meta[u][0]) set_state(*optimizer, shards[u], datapar::detail::make_param_state(kind, meta[u], states[u]));
  }
  int64_t total = 0;
  for (const at::Tensor& k : shards) total += k.numel();
  const at::Tensor gradients = at::zeros({total}, shards.front().options());  // Note [The previous rank's gradient shard]
  int64_t offset = 0;
  for (at::Tensor& k : shards) {
    k.mutable_grad() = gradients.narrow(0, offset, k.numel()).view(k.sizes());
    offset += k.numel();
  }
  kept = std::move(shards);
  kept_optimizer = std::move(optimizer);
  kept_gradients = gradients;
}

int64_t FsdpTwoCopies::rebuild(ProcessGroup& group, int64_t epoch, Standing& mine, const FsdpParts* current,
                            const FsdpParts& next, const std::function<void()>& apply_missed_vote) {
  Impl& m = *impl_;
  if (m.kind == OptimizerKind::kOther) m.kind = movable_kind(*next.optimizer);
  const int me = group.rank();
  const Standings standings(group, mine, Kept{m.whole, m.layout_epoch, m.layout_size, m.layout_rank}.columns());
  if (standings.applies_missed_vote(me) && current) {  // Note [A voted step whose outcome a member missed]
    const torch::NoGradGuard no_grad;
    apply_missed_vote();
    mine = {standings.step(me), mine.voted_epoch, -1, 0};
  }
  const int64_t newest = standings.newest();
  // The state to take: the whole one of a member that has not trained yet (a start, a
  // resume), else the newest layout whose every shard a member keeps at the newest step.
  int whole = -1;
  std::vector<int64_t> layouts;
  for (int r = 0; r < standings.size(); ++r) {
    if (standings.step(r) != newest) continue;
    const Kept kept = Kept::of(standings, r);
    if (kept.whole && whole < 0) whole = r;
    if (!kept.whole) layouts.push_back(kept.layout_epoch);
  }
  std::sort(layouts.rbegin(), layouts.rend());
  layouts.erase(std::unique(layouts.begin(), layouts.end()), layouts.end());
  int64_t layout = -1;
  for (int64_t candidate : layouts) {
    int size = 0;
    std::vector<bool> covered;  // each shard of the layout, kept by a member at the newest step
    for (int r = 0; r < standings.size(); ++r) {
      const Kept kept = Kept::of(standings, r);
      if (standings.step(r) != newest || kept.layout_epoch != candidate) continue;
      size = static_cast<int>(kept.layout_size);
      covered.resize(static_cast<size_t>(size), false);
      const int rank_in_layout = static_cast<int>(kept.layout_rank);
      covered[static_cast<size_t>(rank_in_layout)] = true;                         // its own shard
      if (size > 1) covered[static_cast<size_t>((rank_in_layout + size - 1) % size)] = true;  // the previous rank's
    }
    if (std::all_of(covered.begin(), covered.end(), [](bool k) { return k; })) {
      layout = candidate;
      break;
    }
  }
  if (whole < 0 && layout < 0) {
    throw MembershipError(str_cat(
        "ft: no member keeps every shard of the model at step ", newest, ": a rank and the next one left the job ",
        "at once, and with them a shard of the parameters and optimizer state. The job cannot go on from memory.\n"
        "---> HINT: start it again from its last checkpoint (datapar launch ... --resume); each shard is kept by "
        "two neighbouring ranks, so one failure at a time loses nothing."));
  }
  if (whole >= 0) {
    load_whole_state(group, whole, m.model, m.optimizer, next);
  } else {
    // Unit by unit: one unit whole at a time (its parameters and state), not the model
    // (Note [Re-sharding unit by unit]).
    const std::vector<int> keeper = m.keepers(standings, layout);
    for (size_t u = 0; u < next.shards.size(); ++u) m.fill(m.gather(group, keeper, u, current, next), me, u, next);
    if (current) next.optimizer->param_groups()[0].set_options(current->optimizer->param_groups()[0].options().clone());
    take_buffers(group, standings.first_at_newest(), current, next);  // BatchNorm's statistics
  }
  m.keep_previous(group, next);
  m.whole = false;
  m.model = StateDict();
  m.optimizer = OptimizerState(c10::AnyType::get(), c10::AnyType::get());
  m.layout_epoch = epoch;
  m.layout_size = group.size();
  m.layout_rank = me;
  mine = {newest, mine.commit_epoch, -1, 0};
  return newest;
}

const at::Tensor& FsdpTwoCopies::kept_gradients() const { return impl_->kept_gradients; }

std::vector<ShardedSliceGradients::Unit> slice_units(const FsdpParts& parts) {
  std::map<std::string, at::Tensor> params;
  for (const auto& item : parts.module->named_parameters()) params.emplace(item.key(), item.value());
  std::vector<ShardedSliceGradients::Unit> units(parts.shards.size());
  for (size_t u = 0; u < units.size(); ++u) units[u].shard = parts.shards[u].numel();
  for (const ShardRange& range : parts.ranges) {
    ShardedSliceGradients::Unit& unit = units.at(range.shard);
    const at::Tensor& param = params.at(range.name);
    unit.params.push_back(param);
    unit.offsets.push_back(range.unit_offset);
    unit.numel = std::max(unit.numel, range.unit_offset + param.numel());
  }
  return units;
}

int64_t FsdpTwoCopies::kept_bytes() const {
  const Impl& m = *impl_;
  int64_t bytes = m.kept_gradients.defined() ? static_cast<int64_t>(m.kept_gradients.nbytes()) : 0;
  for (const at::Tensor& k : m.kept) {
    bytes += static_cast<int64_t>(k.nbytes());
    const optim::OptimizerParamState* state = m.kept_optimizer ? state_of(*m.kept_optimizer, k) : nullptr;
    if (state == nullptr) continue;
    for (const at::Tensor& t : datapar::detail::param_state_tensors(m.kind, *state)) bytes += t.nbytes();
  }
  return bytes;
}

void FsdpTwoCopies::update() {
  if (!impl_->kept_optimizer || impl_->kept.empty()) return;
  const torch::NoGradGuard no_grad;
  impl_->kept_optimizer->step();
}

}  // namespace datapar::ft::detail
