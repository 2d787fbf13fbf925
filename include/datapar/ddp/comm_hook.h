// Communication hooks: how DistributedDataParallel reduces one bucket of gradients.
//
// A hook is the extension point for compression, other collectives or other transports.
// DDP calls run() when a bucket's gradients are all in its flat buffer (buckets in the
// same order on every rank) and finish() at the end of backward, once run()'s Work has
// completed. Together they must leave in bucket.buffer the element-wise SUM of every rank's
// buffer: DDP has already scaled each rank's contribution (1/world_size, or the rank's
// share of the global batch when averaging by samples) and applies nothing afterwards.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar {

// One bucket of gradients, as a hook sees it.
struct GradBucket {
  size_t index = 0;           // position in the reduction order; 0 is reduced first
  at::Tensor buffer;          // flat, contiguous; parameters' gradients back to back
  std::vector<at::Tensor> parameters;
  std::vector<size_t> parameter_indices;  // each one's place among DDP's parameters()
  std::vector<int64_t> offsets;  // where each parameter's gradient starts in `buffer`
  bool is_last = false;       // the last bucket of this backward pass
  at::Tensor scratch;         // for the hook's own use (e.g. a compressed copy), kept between run and finish
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  // Starts reducing bucket.buffer over `group`; returns the Work DDP waits for.
  virtual std::shared_ptr<Work> run(ProcessGroup& group, GradBucket& bucket) = 0;
  // Called after the Work completed: e.g. decompress into bucket.buffer.
  virtual void finish(GradBucket& bucket) {}
};

// The default: all_reduce(sum) of the buffer as it is.
std::shared_ptr<CommHook> all_reduce_hook();

// Casts the buffer to bfloat16 / float16 for the all_reduce (half the bytes on the wire),
// and back into the buffer after it. Gradients lose precision: bf16 keeps float32's range
// with 8 bits of mantissa, fp16 10 bits but overflows past 65504.
std::shared_ptr<CommHook> bf16_compress_hook();
std::shared_ptr<CommHook> fp16_compress_hook();

}  // namespace datapar
