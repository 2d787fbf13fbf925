// See standings.h.
#include "ft/standings.h"

#include <algorithm>

#include "datapar/process_group/metadata.h"

namespace datapar::ft::detail {
namespace {

enum StandingColumn : size_t { kStep, kCommitEpoch, kVotedStep, kVotedEpoch, kKept };

}  // namespace

Standings::Standings(ProcessGroup& group, const Standing& mine, const std::vector<int64_t>& kept)
    : size_(group.size()), columns_(kKept + kept.size()) {
  // A table summed over the group: each member fills its own row.
  table_.assign(static_cast<size_t>(size_) * columns_, 0);
  int64_t* row = &table_[static_cast<size_t>(group.rank()) * columns_];
  row[kStep] = mine.step;
  row[kCommitEpoch] = mine.commit_epoch;
  row[kVotedStep] = mine.voted_step;
  row[kVotedEpoch] = mine.voted_epoch;
  std::copy(kept.begin(), kept.end(), row + kKept);
  at::Tensor on_group = metadata_tensor(group, table_);
  group.all_reduce(on_group, ReduceOp::kSum)->synchronize();
  table_ = host_int64s(on_group);

  // Note [A voted step whose outcome a member missed]
  int64_t committed = 0;
  for (int r = 0; r < size_; ++r) committed = std::max(committed, at(r, kStep));
  steps_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    steps_[static_cast<size_t>(r)] = at(r, kStep);
    if (at(r, kVotedStep) != at(r, kStep) || at(r, kStep) + 1 != committed) continue;
    for (int q = 0; q < size_; ++q) {
      if (at(q, kStep) == committed && at(q, kCommitEpoch) == at(r, kVotedEpoch)) {
        steps_[static_cast<size_t>(r)] = committed;
      }
    }
  }
  newest_ = *std::max_element(steps_.begin(), steps_.end());
}

int64_t Standings::at(int rank, size_t column) const {
  return table_.at(static_cast<size_t>(rank) * columns_ + column);
}

int64_t Standings::kept(int rank, size_t column) const { return at(rank, kKept + column); }

bool Standings::applies_missed_vote(int rank) const { return step(rank) > at(rank, kStep); }

int Standings::first_at_newest() const {
  return static_cast<int>(std::find(steps_.begin(), steps_.end(), newest_) - steps_.begin());
}

}  // namespace datapar::ft::detail
