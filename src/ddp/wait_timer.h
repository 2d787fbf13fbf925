// WaitTimer: how long DDP's backward waited for its buckets after its last gradient
// (CommunicationStats::exposed_wait), timed where the waiting happens.
//
// On the CPU that is the host: Work::wait() blocks it. On a GPU the host may not wait at
// all (nccl's wait() returns at once) while the model's stream waits for the buckets, the
// slowest peer included: a host clock reads about 0 there, and --balance auto, which
// subtracts the wait from a rank's step time, would see a fast rank that waited for a slow
// one as the slow one (issue 26). So a GPU model's wait is timed by two CUDA events on its
// stream, read once the GPU has run them.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>

namespace datapar::detail {

class WaitTimer {
 public:
  virtual ~WaitTimer() = default;
  // Around one wait: start() before it is issued, stop() after.
  virtual void start() = 0;
  virtual void stop() = 0;
  // Every wait timed so far. On a GPU, blocks until the stream has run the last stop().
  virtual std::chrono::nanoseconds total() = 0;
};

// For a model on `device`: CUDA events on the current stream of a CUDA device, else the
// host's steady clock.
std::unique_ptr<WaitTimer> wait_timer_for(const c10::Device& device);

// The CUDA one, in builds with CUDA (cuda_wait_timer.cc).
std::unique_ptr<WaitTimer> cuda_wait_timer(c10::DeviceIndex device);

}  // namespace datapar::detail
