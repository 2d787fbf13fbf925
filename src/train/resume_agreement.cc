// See resume_agreement.h.
#include "datapar/train/resume_agreement.h"

#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"

namespace datapar::train {

ResumePoint resume_point(const std::optional<Checkpoint>& checkpoint) {
  if (!checkpoint) return {};
  return {checkpoint->epoch, checkpoint->digest};
}

ResumePoint agree_on_resume(ProcessGroup& group, const std::optional<Checkpoint>& checkpoint) {
  const ResumePoint mine = resume_point(checkpoint);
  const int world = group.size();
  // Each rank fills its own two slots; a sum gives every rank the whole table.
  std::vector<int64_t> table(2 * static_cast<size_t>(world), 0);
  table[2 * group.rank()] = mine.epoch;
  table[2 * group.rank() + 1] = static_cast<int64_t>(mine.digest);
  at::Tensor t = metadata_tensor(group, table);
  group.all_reduce(t, ReduceOp::kSum)->synchronize();
  table = host_int64s(t);
  bool same = true;
  for (int r = 1; r < world; ++r) same = same && table[2 * r] == table[0] && table[2 * r + 1] == table[1];
  if (same) return {table[0], static_cast<uint32_t>(table[1])};
  std::string ranks;
  for (int r = 0; r < world; ++r) {
    const int64_t epoch = table[2 * r];
    char digest[16];
    std::snprintf(digest, sizeof(digest), "%08x", static_cast<unsigned>(table[2 * r + 1]));
    ranks += detail::str_cat(r == 0 ? "" : "; ", "rank ", r, ": ",
                             epoch == 0 && table[2 * r + 1] == 0 ? std::string("no checkpoint (epoch 1 afresh)")
                                                                 : detail::str_cat("epoch ", epoch, ", crc ", digest),
                             r == group.rank() && checkpoint ? detail::str_cat(" (", checkpoint->path, ")") : "");
  }
  throw CheckpointError(detail::str_cat(
      "resume: the ranks found different checkpoints, and would train out of step: ", ranks,
      ". Give every rank the same checkpoint directory (a shared file system), or copy rank 0's newest checkpoint "
      "into each rank's directory before restarting."));
}

}  // namespace datapar::train
