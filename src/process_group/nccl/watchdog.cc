// See watchdog.h.
#include "process_group/nccl/watchdog.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>

#include "datapar/error.h"
#include "process_group/work_completion.h"

namespace datapar::detail {

NcclWatchdog::NcclWatchdog(NcclComm& comm, c10::DeviceIndex device, std::chrono::milliseconds timeout)
    : comm_(comm), device_(device), timeout_(timeout) {
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
  for (Entry& entry : failed) {
    WorkCompletion::fail(*entry.work, std::make_exception_ptr(CommError(comm_.dead_message(entry.op))));
  }
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
      if (std::optional<std::string> reason = comm_.check_async_error(op)) {
        failure = std::make_exception_ptr(
            CommError(str_cat(comm_.describe(op), " failed: ", *reason,
                              ". A peer probably exited or the network failed; the nccl group was aborted. "
                              "Make a new group.")));
      }
    }
    if (!failure && NcclClock::now() > deadline) {
      const std::string reason = str_cat("not completed within the group's timeout (",
                                         std::chrono::duration<double>(timeout_).count(), " s)");
      if (comm_.abort(op, reason)) {
        failure = std::make_exception_ptr(
            TimeoutError(str_cat(comm_.describe(op), ": ", reason,
                                 ". A peer is missing or stuck, or the processes issued different operations. The "
                                 "nccl group was aborted; make a new group.")));
      }
    }
    if (failure) {
      WorkCompletion::fail(*pop_front().work, failure);  // the ones behind it fail next round: the group is dead
      continue;
    }
    if (comm_.dead()) continue;  // aborted meanwhile by another thread: fail everything next round
    pause();
  }
}

}  // namespace datapar::detail
