// See resume_agreement.h.
#include "datapar/train/resume_agreement.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "datapar/error.h"
#include "datapar/process_group/metadata.h"
#include "serialization/zip_crc.h"

namespace datapar::train {

ResumePoint resume_point(const std::optional<Checkpoint>& checkpoint) {
  ResumePoint point;
  if (!checkpoint) return point;
  point.epoch = checkpoint->epoch;
  const int fd = ::open(checkpoint->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(detail::str_cat(checkpoint->path, ": cannot read it again (", std::strerror(errno), ")."));
  std::vector<char> buffer(1 << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw CheckpointError(detail::str_cat(checkpoint->path, ": cannot read it again (", why, ")."));
    }
    if (n == 0) break;
    crc = detail::crc32(buffer.data(), static_cast<size_t>(n), crc);
  }
  ::close(fd);
  point.digest = crc;
  return point;
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
