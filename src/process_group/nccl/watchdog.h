// NcclWatchdog: the thread that completes a NCCL group's Works. It polls the end event of
// the oldest operation in flight (Note [Polling NCCL] in communicator.h): completed, the
// Work finishes; an asynchronous NCCL error or the group's timeout instead aborts the
// group, fails that Work (CommError or TimeoutError) and every one queued behind it. Until
// an operation has completed, its entry holds the tensors it uses. It never launches
// anything; process_group.cc does.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAEvent.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "process_group/nccl/communicator.h"
#include "process_group/nccl/work.h"
#include "trace/recorder.h"

namespace datapar::detail {

class NcclWatchdog {
 public:
  struct Entry {
    std::shared_ptr<NcclWork> work;
    std::string op;                               // "all_reduce(sum)"
    std::shared_ptr<at::cuda::CUDAEvent> end;     // recorded after everything the operation queued
    std::vector<at::Tensor> tensors;              // used on the group's stream; released once `end` completed
    NcclClock::time_point deadline;               // launch + the group's timeout
    trace::detail::Queued queued;                 // for a trace (trace.h), taken at launch
  };

  // Watches operations of `comm`, whose stream lives on `device`. `timeout`: the group's
  // limit, for messages. `end_process_on_failure`: NcclOptions's (Note [A failure after
  // wait()] in watchdog.cc).
  NcclWatchdog(NcclComm& comm, c10::DeviceIndex device, std::chrono::milliseconds timeout,
               bool end_process_on_failure);
  // Waits until every queued Work has finished or failed (at most the timeout, after which
  // the group is aborted), then stops the thread.
  ~NcclWatchdog();

  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Queues an operation; entries must come in the order of their events on the stream.
  // Thread-safe.
  void push(Entry entry);

 private:
  void loop();
  // Pops the oldest entry; it is released by the caller, outside the lock.
  Entry pop_front();
  // The group is dead: fails every queued Work.
  void fail_queued();
  // Fails one Work with `error`, or ends the process (Note [A failure after wait()]).
  void fail(NcclWork& work, const std::exception_ptr& error);

  NcclComm& comm_;
  const c10::DeviceIndex device_;
  const std::chrono::milliseconds timeout_;
  const bool end_process_on_failure_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Entry> queue_;
  // When the previous operation was seen complete: the stream runs operations in order, so
  // the next one started no earlier (the trace's "started"; this thread only).
  trace::Clock::time_point previous_finished_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace datapar::detail
