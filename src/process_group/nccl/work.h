// NcclWork: the Work of one NCCL operation. The watchdog (watchdog.h) finishes or fails it
// when the operation's end event has completed or the group failed; wait() in between
// orders the caller's current stream after that event instead of blocking the host
// (work.h, NcclOptions::blocking_wait).
#pragma once

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/Device.h>

#include <atomic>
#include <memory>
#include <string>

#include "datapar/process_group/work.h"

namespace datapar::detail {

class NcclWork : public Work {
 public:
  // `end`: recorded on the group's stream after everything the operation queued there.
  // `blocking`: wait() blocks the host until the watchdog has finished or failed the Work.
  NcclWork(std::string what, c10::DeviceIndex device, std::shared_ptr<at::cuda::CUDAEvent> end, bool blocking)
      : Work(std::move(what)), device_(device), end_(std::move(end)), blocking_(blocking) {}

  // For the watchdog, just before it fails the Work: whether a wait() had already returned
  // with the results queued for the caller's stream (Note [A failure after wait()] in
  // watchdog.cc). A wait() from then on blocks and throws the error instead.
  bool failing_after_hand_out() { return state_.exchange(State::failed) == State::handed_out; }

 protected:
  bool wait_on_stream(bool hand_out) override;

 private:
  enum class State { pending, handed_out, failed };

  const c10::DeviceIndex device_;
  // Shared with the watchdog; the Work may outlive the group, and the event with it.
  const std::shared_ptr<at::cuda::CUDAEvent> end_;
  const bool blocking_;
  std::atomic<State> state_{State::pending};
};

}  // namespace datapar::detail
