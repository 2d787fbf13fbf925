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

void SliceGradients::begin(int rank, int size, int slices) {
  int most = 0;  // the most slices a member trains: every member sends that many, for an even gather
  for (int r = 0; r < size; ++r) {
    const SliceRange range = slices_of(r, size, slices);
    most = std::max(most, range.last - range.first);
  }
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
  double total = 0;
  for (int r = 0; r < size_; ++r) {
    const SliceRange range = slices_of(r, size_, slices_);
    const at::Tensor theirs = gathered_[r].select(1, numel_).to(at::kDouble).cpu();
    for (int i = range.first; i < range.last; ++i) {
      grads.push_back(gathered_[r][i - range.first].narrow(0, 0, numel_));
      rows.push_back(theirs[i - range.first].item<double>());
      total += rows.back();
    }
  }
  // A pass where no rank had a sample sums no gradient: zero, not NaN.
  const auto share = [&](size_t i) { return total > 0 ? rows[i] / total : 0.0; };
  const bool even = std::all_of(rows.begin(), rows.end(), [&](double r) { return r == rows.front(); });
  if (even) {
    sum_.copy_(grads.front());
    for (size_t i = 1; i < grads.size(); ++i) sum_.add_(grads[i]);
    sum_.mul_(share(0));
  } else {
    at::mul_out(sum_, grads.front(), share(0));
    for (size_t i = 1; i < grads.size(); ++i) {
      at::mul_out(scaled_, grads[i], share(i));
      sum_.add_(scaled_);
    }
  }
  // Each .grad an alias of its part of the sum (set_, not a view: libtorch's zero_grad()
  // calls detach_(), which autograd refuses for views).
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    p.mutable_grad() = at::empty({0}, sum_.options()).set_(sum_.storage(), offset, p.sizes(), {});
    offset += p.numel();
  }
}

}  // namespace detail
}  // namespace datapar::ft
