// See watchdog.h.
//
// Note [A failure after wait()]
// wait() does not block (NcclOptions::blocking_wait): it queues the caller's stream behind
// the operation and returns, and the caller queues the optimizer step, or copies gradients
// out of DDP's buckets, behind it. When the watchdog finds later that the operation failed
// or timed out, it aborts the communicator, which ends the operation's kernels early: the
// stream moves on and what was queued behind consumes partial data. No exception can undo
// that, so by default the process ends here, with the error on stderr (as PyTorch's
// TORCH_NCCL_ASYNC_ERROR_HANDLING does), before a corrupted parameter reaches another step
// or a checkpoint; restarting from the last checkpoint is the way on. A program that set
// NcclOptions::end_process_on_failure to false gets the error from the next wait(),
// synchronize() or call on the group instead, and must itself discard what the failed
// step touched. A Work failed before any wait() returned it is no danger: its wait() throws.
#include "process_group/nccl/watchdog.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>

#include "datapar/error.h"
#include "process_group/work_completion.h"

namespace datapar::detail {
namespace {

bool point_to_point(const std::string& op) { return op.rfind("send(", 0) == 0 || op.rfind("recv(", 0) == 0; }

std::exception_ptr async_failure(const NcclComm& comm, const std::string& op, const std::string& reason) {
  return std::make_exception_ptr(CommError(str_cat(comm.describe(op), " failed: ", reason,
                                                   ". A peer probably exited or the network failed; the nccl group "
                                                   "was aborted. Make a new group.")));
}

}  // namespace

NcclWatchdog::NcclWatchdog(NcclComm& comm, c10::DeviceIndex device, std::chrono::milliseconds timeout,
                           bool end_process_on_failure)
    : comm_(comm), device_(device), timeout_(timeout), end_process_on_failure_(end_process_on_failure) {
  thread_ = std::thread([this] { loop(); });
}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void NcclWatchdog::push(Entry entry) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(entry));
  }
  wake_.notify_one();
}

NcclWatchdog::Entry NcclWatchdog::pop_front() {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry entry = std::move(queue_.front());
  queue_.pop_front();
  return entry;
}

void NcclWatchdog::fail_queued() {
  std::deque<Entry> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed.swap(queue_);
  }
  // Their tensors may still be in use by kernels the abort did not stop: recordStream
  // (Note [Streams of an operation] in process_group.cc) keeps the memory from reuse.
  // All of them fail, even those whose end event has completed: after the abort, an event
  // also completes for kernels the abort cut short, so a completion says nothing of the data.
  for (Entry& entry : failed) fail(*entry.work, std::make_exception_ptr(CommError(comm_.dead_message(entry.op))));
}

void NcclWatchdog::fail(NcclWork& work, const std::exception_ptr& error) {
  if (work.failing_after_hand_out() && end_process_on_failure_) {
    std::string what;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    }
    std::cerr << "datapar: ending the process: " << what
              << "\nwait() had already returned, so the work queued after it (gradients, an optimizer step) ran on "
                 "partial results. Restart from the last checkpoint. To handle such failures in the program "
                 "instead, set NcclOptions::end_process_on_failure = false (DATAPAR_NCCL_END_PROCESS_ON_FAILURE=0)."
              << std::endl;
    std::fflush(nullptr);
    std::_Exit(EXIT_FAILURE);  // no exit handlers: they would wait on this thread and the dead group
  }
  WorkCompletion::fail(work, error);
}

void NcclWatchdog::loop() {
  // Events are queried, tensors freed and the communicator aborted from this thread: on the
  // group's device, not on whatever device 0 a new thread starts with.
  c10::cuda::CUDAGuard guard(device_);
  try {
    trace::name_thread("nccl watchdog");
  } catch (...) {
  }
  PollPause pause;
  for (;;) {
    std::shared_ptr<at::cuda::CUDAEvent> end;
    std::string op;
    NcclClock::time_point deadline;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every Work is done
      // Only this thread pops, so the front stays; copies, since push() may run meanwhile.
      end = queue_.front().end;
      op = queue_.front().op;
      deadline = queue_.front().deadline;
    }
    if (comm_.dead()) {  // aborted by the launching thread, or by this one for an older entry
      fail_queued();
      continue;
    }
    std::exception_ptr failure;
    bool completed = false;
    std::string cuda_error;
    try {
      completed = end->query();
    } catch (const c10::Error& e) {  // a CUDA error; sticky ones leave the device unusable
      cuda_error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      cuda_error = e.what();
    }
    if (!cuda_error.empty()) {
      const std::string reason = str_cat("CUDA error: ", cuda_error);
      if (comm_.abort(op, reason)) {
        failure = std::make_exception_ptr(CommError(str_cat(comm_.describe(op), " failed: ", reason,
                                                            ". The nccl group was aborted; make a new group.")));
      }
    }
    if (completed) {
      // A completion says nothing once the group was aborted meanwhile (the abort ends
      // kernels early), nor when NCCL reports an error for the communicator: ask both first.
      if (std::optional<std::string> reason = comm_.check_async_error(op)) {
        fail(*pop_front().work, async_failure(comm_, op, *reason));
        continue;
      }
      if (comm_.dead()) continue;  // fails everything next round
      Entry entry = pop_front();
      if (entry.queued.on) {
        // Host times: queued at launch, started when the stream reached it (no earlier than
        // the previous operation's end), finished when this thread saw its end event.
        const trace::Clock::time_point now = trace::Clock::now();
        trace::detail::record_collective(entry.queued, entry.op, std::max(entry.queued.at, previous_finished_), now);
        previous_finished_ = now;
      }
      WorkCompletion::finish(*entry.work);
      pause.reset();
      continue;  // `entry` goes here, outside the lock: its tensors return to the allocator
    }
    if (!failure) {
      if (std::optional<std::string> reason = comm_.check_async_error(op)) failure = async_failure(comm_, op, *reason);
    }
    if (!failure && NcclClock::now() > deadline) {
      const std::string reason = str_cat("not completed within the group's timeout (",
                                         std::chrono::duration<double>(timeout_).count(), " s)");
      if (comm_.abort(op, reason)) {
        failure = std::make_exception_ptr(
            TimeoutError(str_cat(comm_.describe(op), ": ", reason,
                                 ". A peer is missing or stuck, or the processes issued different operations",
                                 point_to_point(op) ? str_cat(" (on nccl a send waits for the peer's matching recv, "
                                                              "behind everything the peer issued before it: two ranks "
                                                              "that each send to the other first wait for each other; "
                                                              "issue the recv first on one of them)")
                                                    : "",
                                 ". The nccl group was aborted; make a new group.")));
      }
    }
    if (failure) {
      fail(*pop_front().work, failure);  // the ones behind it fail next round: the group is dead
      continue;
    }
    if (comm_.dead()) continue;  // aborted meanwhile by another thread: fail everything next round
    pause();
  }
}

}  // namespace datapar::detail
