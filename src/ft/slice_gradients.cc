// See datapar/ft/slice_gradients.h.
//
// Note [Gradients that do not depend on who is alive]
// Fault-tolerant training promises the model of an undisturbed run, whoever dies or joins.
// Equal in exact arithmetic is not enough: a global batch cut over 2 ranks instead of 3
// sums its rows in another order (inside the weight gradient's matrix product, and in the
// all-reduce), the last bits differ, and on real data a bit is enough: a ReLU whose input
// sits at zero flips, one step's gradient moves by 1e-4, and momentum carries it on (issue
// 46: 5e-2 off after three epochs, the job exiting 0). So every float operation of a step
// is the same whoever is alive:
// - the global batch is cut into a fixed number of slices (the job's full size), and each
//   slice is a forward and backward of its own, with its own rows, on whichever member
//   trains it: the same shapes, the same bits;
// - the slices' gradients are all-gathered (through shared memory on one machine) and each
//   member sums them in slice order, elementwise: ((g_0 + g_1) + ...) * (rows_i / rows)
//   when the slices have equal rows, else ((w_0 g_0) + w_1 g_1) + ... with w_i = rows_i /
//   rows; a multiplication and an addition are never fused, so that vector lanes, scalar
//   tails and threads' chunks agree whatever the sizes.
// What this costs (docs/benchmarks.md): each member receives every other member's
// gradients, (n-1) of them where a ring all-reduce moves 2(n-1)/n, and sums n; and the
// exchange no longer overlaps backward. An all-to-all of blocks would move as little as a
// ring, but went over TCP even on one machine and cost the MLP's step more.
#include "datapar/ft/slice_gradients.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "datapar/error.h"

namespace datapar::ft {

SliceRange slices_of(int rank, int size, int slices) {
  const auto at = [&](int r) { return static_cast<int>(static_cast<int64_t>(slices) * r / size); };
  return {at(rank), at(rank + 1)};
}

int most_slices_of(int size, int slices) {
  int most = 0;
  for (int r = 0; r < size; ++r) {
    const SliceRange range = slices_of(r, size, slices);
    most = std::max(most, range.last - range.first);
  }
  return most;
}

namespace detail {

SliceGradients::SliceGradients(std::vector<at::Tensor> params) : params_(std::move(params)) {
  DATAPAR_CHECK(!params_.empty(), "SliceGradients: no parameters.");
  for (const at::Tensor& p : params_) {
    DATAPAR_CHECK(p.is_floating_point() && p.scalar_type() == params_.front().scalar_type() &&
                      p.device() == params_.front().device(),
                  "SliceGradients: the parameters must be floating point, of one dtype and device.");
    numel_ += p.numel();
  }
}

void sum_in_slice_order(at::Tensor& sum, at::Tensor& scaled, const std::vector<at::Tensor>& grads,
                        const std::vector<double>& rows) {
  DATAPAR_CHECK(!grads.empty() && grads.size() == rows.size(), "sum_in_slice_order: ", grads.size(),
                " gradients and ", rows.size(), " row counts.");
  double total = 0;
  for (double r : rows) total += r;
  // A pass where no rank had a sample sums no gradient: zero, not NaN.
  const auto share = [&](size_t i) { return total > 0 ? rows[i] / total : 0.0; };
  const bool even = std::all_of(rows.begin(), rows.end(), [&](double r) { return r == rows.front(); });
  if (even) {
    sum.copy_(grads.front());
    for (size_t i = 1; i < grads.size(); ++i) sum.add_(grads[i]);
    sum.mul_(share(0));
  } else {
    at::mul_out(sum, grads.front(), share(0));
    for (size_t i = 1; i < grads.size(); ++i) {
      at::mul_out(scaled, grads[i], share(i));
      sum.add_(scaled);
    }
  }
}

void SliceGradients::begin(int rank, int size, int slices) {
  // Every member sends the most slices one trains, for an even gather.
  const int most = most_slices_of(size, slices);
  const at::TensorOptions options = params_.front().options();
  if (!gathered_.defined() || gathered_.size(0) != size || gathered_.size(1) != most) {
    mine_ = at::zeros({most, numel_ + 1}, options);
    gathered_ = at::zeros({size, most, numel_ + 1}, options);
    sum_ = at::zeros({numel_}, options);
    scaled_ = at::zeros({numel_}, options);
  }
  rank_ = rank;
  size_ = size;
  slices_ = slices;
  kept_ = 0;
}

void SliceGradients::keep(int64_t rows) {
  const SliceRange mine = slices_of(rank_, size_, slices_);
  DATAPAR_CHECK(kept_ < mine.last - mine.first, "SliceGradients: rank ", rank_, " of ", size_, " trains ",
                mine.last - mine.first, " slices of ", slices_, "; keep() was called once more.");
  DATAPAR_CHECK(rows >= 0 && rows < (int64_t{1} << 24), "SliceGradients: a slice of ", rows, " rows.");
  at::Tensor slot = mine_[kept_];
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    at::Tensor part = slot.narrow(0, offset, p.numel());
    at::Tensor& grad = p.mutable_grad();
    if (grad.defined()) {
      part.view(p.sizes()).copy_(grad);
      grad.zero_();
    } else {
      part.zero_();
    }
    offset += p.numel();
  }
  slot[numel_] = static_cast<double>(rows);
  ++kept_;
}

void SliceGradients::reduce(ProcessGroup& group) {
  DATAPAR_CHECK(group.rank() == rank_ && group.size() == size_, "SliceGradients: begin() was for rank ", rank_,
                " of ", size_, ", the group is rank ", group.rank(), " of ", group.size());
  const SliceRange own = slices_of(rank_, size_, slices_);
  DATAPAR_CHECK(kept_ == own.last - own.first, "SliceGradients: rank ", rank_, " of ", size_, " trains ",
                own.last - own.first, " slices but kept ", kept_);
  if (size_ > 1) {
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < size_; ++r) outputs.push_back(gathered_[r]);
    group.all_gather(outputs, mine_)->wait();
  } else {
    gathered_[0].copy_(mine_);
  }
  // Slice i's gradient and rows, in slice order.
  std::vector<at::Tensor> grads;
  std::vector<double> rows;
  for (int r = 0; r < size_; ++r) {
    const SliceRange range = slices_of(r, size_, slices_);
    const at::Tensor theirs = gathered_[r].select(1, numel_).to(at::kDouble).cpu();
    for (int i = range.first; i < range.last; ++i) {
      grads.push_back(gathered_[r][i - range.first].narrow(0, 0, numel_));
      rows.push_back(theirs[i - range.first].item<double>());
    }
  }
  sum_in_slice_order(sum_, scaled_, grads, rows);
  // Each .grad an alias of its part of the sum (set_, not a view: libtorch's zero_grad()
  // calls detach_(), which autograd refuses for views).
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    p.mutable_grad() = at::empty({0}, sum_.options()).set_(sum_.storage(), offset, p.sizes(), {});
    offset += p.numel();
  }
}

ShardedSliceGradients::ShardedSliceGradients(std::vector<Unit> units, const at::TensorOptions& options, int rank,
                                             int size, int shard_size)
    : units_(std::move(units)),
      options_(options),
      rank_(rank),
      size_(size),
      shard_size_(shard_size == 0 ? size : shard_size),
      copies_(shard_size == 0 && size > 1 ? 2 : 1) {
  DATAPAR_CHECK(!units_.empty() && size_ >= 1 && rank_ >= 0 && rank_ < size_ && shard_size_ >= 1 &&
                    size_ % shard_size_ == 0,
                "ShardedSliceGradients: ", units_.size(), " units, rank ", rank_, " of ", size_, ", shards over ",
                shard_size_, ".");
  const int n = shard_size_;
  for (const Unit& unit : units_) {
    DATAPAR_CHECK(!unit.params.empty() && unit.offsets.size() == unit.params.size() &&
                      unit.shard * n >= unit.numel && unit.shard * (n - 1) < unit.numel + n,
                  "ShardedSliceGradients: a unit of ", unit.numel, " elements with shards of ", unit.shard, " over ",
                  n, " ranks.");
    for (size_t i = 0; i < unit.params.size(); ++i) {
      DATAPAR_CHECK(unit.offsets[i] >= 0 && unit.offsets[i] + unit.params[i].numel() <= unit.numel,
                    "ShardedSliceGradients: a parameter at ", unit.offsets[i], " of a unit of ", unit.numel,
                    " elements.");
    }
    total_ += unit.shard;
  }
}

void ShardedSliceGradients::begin(int slices) {
  slices_ = slices;
  passes_ = 0;
  // Zero: the padding's gradient stays zero. Made once per membership epoch, not per step.
  if (!kept_.defined() || kept_.size(0) != slices) {
    kept_ = at::zeros({slices, copies_ * total_}, options_);
  } else {
    kept_.zero_();
  }
  rows_.assign(static_cast<size_t>(slices), 0.0);
  if (!sum_.defined() || sum_.numel() != copies_ * total_) {
    sum_ = at::zeros({copies_ * total_}, options_);
    scaled_ = at::zeros({copies_ * total_}, options_);
  }
}

at::Tensor ShardedSliceGradients::gather_pieces(const Unit& unit, const at::Tensor& mine, ProcessGroup& shard_group,
                                                ProcessGroup& replicate_group) const {
  const int k = shard_size_, groups = size_ / k, index = rank_ % k;
  const int64_t numel = unit.numel, begin = std::min<int64_t>(numel, index * unit.shard);
  const int64_t length = std::min<int64_t>(numel, begin + unit.shard) - begin;
  std::vector<at::Tensor> local;  // whole, within the replica group (fast links)
  for (int q = 0; q < k; ++q) local.push_back(q == index ? mine : at::empty_like(mine));
  if (k > 1) shard_group.all_gather(local, mine)->wait();
  const at::Tensor pieces = at::zeros({k, unit.shard + 1}, mine.options());
  for (int q = 0; q < k; ++q) {
    pieces[q].narrow(0, 0, length).copy_(local[static_cast<size_t>(q)].narrow(0, begin, length));
    pieces[q][unit.shard] = local[static_cast<size_t>(q)][numel];
  }
  std::vector<at::Tensor> across;  // this index's pieces, from every group
  const int group = rank_ / k;
  for (int h = 0; h < groups; ++h) across.push_back(h == group ? pieces : at::empty_like(pieces));
  if (groups > 1) replicate_group.all_gather(across, pieces)->wait();
  return at::cat(across);  // member r = h * k + q at row r
}

void ShardedSliceGradients::exchange(ProcessGroup& group, int64_t rows, ProcessGroup* shard_group,
                                     ProcessGroup* replicate_group) {
  DATAPAR_CHECK(group.rank() == rank_ && group.size() == size_, "ShardedSliceGradients: made for rank ", rank_,
                " of ", size_, ", the group is rank ", group.rank(), " of ", group.size());
  const bool by_pieces = shard_group != nullptr && replicate_group != nullptr;
  DATAPAR_CHECK(!by_pieces || (copies_ == 1 && shard_group->size() == shard_size_ &&
                               shard_group->rank() == rank_ % shard_size_ &&
                               replicate_group->size() == size_ / shard_size_ &&
                               replicate_group->rank() == rank_ / shard_size_),
                "ShardedSliceGradients: the replica group and the group across replicas do not match rank ", rank_,
                " of ", size_, " in groups of ", shard_size_, ".");
  DATAPAR_CHECK(passes_ < most_slices_of(size_, slices_), "ShardedSliceGradients: exchange() once more than the ",
                most_slices_of(size_, slices_), " passes of a step.");
  DATAPAR_CHECK(rows >= 0 && rows < (int64_t{1} << 24), "ShardedSliceGradients: a slice of ", rows, " rows.");
  const int own_index = rank_ % shard_size_, previous = (rank_ + size_ - 1) % size_;
  // Slice trained by member r in this pass, or -1 for a shadow.
  std::vector<int> slice_of(static_cast<size_t>(size_), -1);
  for (int r = 0; r < size_; ++r) {
    const SliceRange range = slices_of(r, size_, slices_);
    if (range.first + passes_ < range.last) slice_of[r] = range.first + passes_;
  }
  int64_t at_ = 0;  // the unit's place among one rank's shards
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    const int64_t numel = unit.numel;
    const at::Tensor mine = at::zeros({numel + 1}, unit.params.front().options().requires_grad(false));
    for (size_t i = 0; i < unit.params.size(); ++i) {
      at::Tensor& p = unit.params[i];
      if (p.grad().defined()) mine.narrow(0, unit.offsets[i], p.numel()).copy_(p.grad().reshape({-1}));
      p.mutable_grad() = at::Tensor();  // released: the unit's next backward makes it anew
    }
    mine[numel] = static_cast<double>(rows);
    if (by_pieces) {
      const at::Tensor pieces = gather_pieces(unit, mine, *shard_group, *replicate_group);
      for (int r = 0; r < size_; ++r) {
        const int i = slice_of[r];
        if (i < 0) continue;
        kept_[i].narrow(0, at_, unit.shard).copy_(pieces[r].narrow(0, 0, unit.shard));
        if (u == 0) rows_[static_cast<size_t>(i)] = pieces[r][unit.shard].item<double>();
      }
      at_ += unit.shard;
      continue;
    }
    std::vector<at::Tensor> gathered;
    for (int r = 0; r < size_; ++r) gathered.push_back(r == rank_ ? mine : at::empty_like(mine));
    if (size_ > 1) group.all_gather(gathered, mine)->wait();
    // Of each slice trained, this rank's shard of the unit's flat and the previous rank's.
    const auto shard_of = [&](const at::Tensor& flat, int r) {
      const int64_t begin = std::min<int64_t>(numel, r * unit.shard);
      return flat.narrow(0, begin, std::min<int64_t>(numel, begin + unit.shard) - begin);
    };
    for (int r = 0; r < size_; ++r) {
      const int i = slice_of[r];
      if (i < 0) continue;
      const at::Tensor flat = gathered[r].narrow(0, 0, numel);
      const at::Tensor own = shard_of(flat, own_index);
      kept_[i].narrow(0, at_, own.numel()).copy_(own);
      if (copies_ == 2) {
        const at::Tensor theirs = shard_of(flat, previous);
        kept_[i].narrow(0, total_ + at_, theirs.numel()).copy_(theirs);
      }
      if (u == 0) rows_[static_cast<size_t>(i)] = gathered[r][numel].item<double>();
    }
    at_ += unit.shard;
  }
  ++passes_;
}

void ShardedSliceGradients::reduce(std::vector<at::Tensor>& own, const at::Tensor& previous) {
  DATAPAR_CHECK(passes_ == most_slices_of(size_, slices_), "ShardedSliceGradients: ", passes_, " passes of ",
                most_slices_of(size_, slices_), " exchanged.");
  DATAPAR_CHECK(own.size() == units_.size(), "ShardedSliceGradients: ", own.size(), " shards for ", units_.size(),
                " units.");
  std::vector<at::Tensor> grads;
  for (int i = 0; i < slices_; ++i) grads.push_back(kept_[i]);
  sum_in_slice_order(sum_, scaled_, grads, rows_);
  int64_t offset = 0;
  for (size_t u = 0; u < own.size(); ++u) {
    DATAPAR_CHECK(own[u].numel() == units_[u].shard, "ShardedSliceGradients: unit ", u, "'s shard has ",
                  own[u].numel(), " elements, not ", units_[u].shard);
    // An alias (set_, not a view: see SliceGradients::reduce).
    own[u].mutable_grad() = at::empty({0}, sum_.options()).set_(sum_.storage(), offset, own[u].sizes(), {});
    offset += units_[u].shard;
  }
  if (previous.defined() && copies_ == 2) previous.view({-1}).copy_(sum_.narrow(0, total_, total_));
}

}  // namespace detail
}  // namespace datapar::ft
