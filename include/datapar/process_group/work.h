// Work: a collective in flight. Returned by every ProcessGroup call; wait() for its result.
//
// Host backends (gloo, mpi) finish a Work when the data is in place: wait() blocks the
// calling thread until then. A device backend (nccl) finishes it when the operation has
// completed on its stream, and its wait() only makes the caller's current CUDA stream wait
// for the operation, as PyTorch's does: work queued there afterwards sees the result, and
// the host goes on at once (unless the group was asked to block, NcclOptions::blocking_wait).
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>

namespace datapar {
namespace detail {
class WorkCompletion;
struct CollectiveRecord;
}  // namespace detail

class Work {
 public:
  explicit Work(std::string what) : what_(std::move(what)), done_(promise_.get_future().share()) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the operation finished, at most `timeout` (by default its group's,
  // ProcessGroup::timeout(), plus kWaitGrace); throws the operation's error (CommError when a peer failed,
  // TimeoutError when it ran past the group's timeout), or TimeoutError if it is still
  // running when `timeout` ends. On a device backend: throws the error of an operation that
  // already failed, else orders the caller's current stream after the operation and returns
  // without blocking (see above). Thread-safe; may be called more than once.
  void wait() { wait(timeout_); }
  void wait(std::chrono::milliseconds timeout);

  // Blocks the calling thread until the operation has finished, on every backend, at most
  // `timeout` (by default the group's), and throws its error as wait() does; on a device
  // backend also orders the current stream after it. For results the host reads and acts on
  // (metadata.h): after a non-blocking wait() a failed collective would leave the host
  // reading partial data.
  void synchronize() { synchronize(timeout_); }
  void synchronize(std::chrono::milliseconds timeout);

  // Whether the operation has finished (successfully or not). Never blocks.
  bool is_completed() const;
  // How long the calling thread has been blocked in wait() and synchronize() so far, over
  // every Work: the time it spent waiting for other ranks (stragglers.h reads it per step).
  static std::chrono::nanoseconds time_blocked_on_this_thread();

  const std::string& what() const { return what_; }

 protected:
  // Device backends: make the calling thread's current stream wait for the operation and
  // return true, so that wait() does not block the host; false: wait() blocks.
  // `hand_out`: the caller returns at once (wait()), so work it queues next may consume the
  // results before the operation is known to succeed; false: it blocks until then
  // (synchronize()).
  virtual bool wait_on_stream(bool hand_out) {
    (void)hand_out;
    return false;
  }

  // Host backends whose results still have to reach a device (gloo's CUDA tensors, staged
  // through host memory): called on the waiting thread each time a wait() or synchronize()
  // finds the operation done, to queue the results' way back on its current stream. Must
  // not block, and must deliver once however often it is called.
  virtual void deliver() {}

 private:
  // Only the backends report the outcome (src/process_group/work_completion.h).
  friend class detail::WorkCompletion;
  // The first outcome counts: an abort (ProcessGroup::abort) may fail a Work that its
  // backend completes later.
  void finish() {
    if (!settled_.exchange(true)) {
      note_end(nullptr);
      promise_.set_value();
    }
  }
  void fail(std::exception_ptr error) {
    if (!settled_.exchange(true)) {
      note_end(error);
      promise_.set_exception(std::move(error));
    }
  }
  // Tells the flight recorder's record of this collective, if it has one, when the backend
  // began to run it and how it ended.
  void note_start();
  void note_end(const std::exception_ptr& error);
  void attach(std::shared_ptr<detail::CollectiveRecord> record);

  std::string what_;
  // Its group's timeout plus kWaitGrace, set as the group hands it out; a year for a Work
  // made elsewhere.
  std::chrono::milliseconds timeout_ = std::chrono::hours(24 * 365);
  std::promise<void> promise_;
  std::atomic<bool> settled_{false};
  std::shared_future<void> done_;
  // The flight recorder's (flight_recorder.h), attached after the backend made the Work,
  // which may start and end first: both are kept until then.
  std::mutex record_mutex_;
  std::shared_ptr<detail::CollectiveRecord> record_;
  int64_t started_ns_ = 0;  // system clock; 0: not known to have started
  bool ended_ = false;
  std::exception_ptr end_error_;
};

}  // namespace datapar
