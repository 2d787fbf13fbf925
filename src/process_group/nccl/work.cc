// See work.h.
#include "process_group/nccl/work.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace datapar::detail {

bool NcclWork::wait_on_stream() {
  if (blocking_) return false;
  // The caller's current stream on the group's device, which need not be its current
  // device; the guard gives that back. Neither thread changes the event once recorded,
  // so waiting here while the watchdog queries it is safe.
  c10::cuda::CUDAGuard guard(device_);
  end_->block(c10::cuda::getCurrentCUDAStream(device_));
  return true;
}

}  // namespace datapar::detail
