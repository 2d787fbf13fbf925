// See work.h.
#include "process_group/nccl/work.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace datapar::detail {

bool NcclWork::wait_on_stream(bool hand_out) {
  if (blocking_) return false;
  if (hand_out) {
    State was = State::pending;
    // Failed meanwhile: block instead, and throw its error.
    if (!state_.compare_exchange_strong(was, State::handed_out) && was == State::failed) return false;
  }
  // The caller's current stream on the group's device, which need not be its current
  // device; the guard gives that back. Neither thread changes the event once recorded,
  // so waiting here while the watchdog queries it is safe.
  c10::cuda::CUDAGuard guard(device_);
  end_->block(c10::cuda::getCurrentCUDAStream(device_));
  return true;
}

}  // namespace datapar::detail
