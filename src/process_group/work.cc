// See work.h and work_completion.h.
#include "datapar/process_group/work.h"

#include <atomic>

#include "datapar/error.h"
#include "process_group/collective_failure.h"
#include "process_group/flight_recorder.h"
#include "process_group/work_completion.h"

namespace datapar {
namespace detail {
namespace {

// A failed collective's reason, for its record.
std::string reason(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace
}  // namespace detail

void Work::wait(std::chrono::milliseconds timeout) {
  if (!is_completed() && wait_on_stream(/*hand_out=*/true)) return;
  synchronize(timeout);
}

namespace {

thread_local std::chrono::nanoseconds blocked_on_this_thread{0};

// Adds the time from its making to its end to this thread's blocked time.
class BlockedTime {
 public:
  ~BlockedTime() { blocked_on_this_thread += std::chrono::steady_clock::now() - start_; }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

std::chrono::nanoseconds Work::time_blocked_on_this_thread() { return blocked_on_this_thread; }

void Work::synchronize(std::chrono::milliseconds timeout) {
  const BlockedTime blocked;
  if (!is_completed()) (void)wait_on_stream(/*hand_out=*/false);
  if (done_.wait_for(timeout) != std::future_status::ready) {
    detail::note_collective_failure();
    detail::flight_recorder_on_failure(what_ + ": not finished after its timeout");
    throw TimeoutError(detail::str_cat(what_, ": not finished after ", std::chrono::duration<double>(timeout).count(),
                                       " s. Did every process issue the same collectives in the same order?"));
  }
  done_.get();  // rethrows the operation's error
  deliver();
}

bool Work::is_completed() const { return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

void Work::note_start() {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  std::shared_ptr<detail::CollectiveRecord> record;
  {
    const std::lock_guard<std::mutex> lock(record_mutex_);
    started_ns_ = now;
    record = record_;
  }
  if (record) record->started_ns.store(now);
}

void Work::note_end(const std::exception_ptr& error) {
  std::shared_ptr<detail::CollectiveRecord> record;
  {
    const std::lock_guard<std::mutex> lock(record_mutex_);
    ended_ = true;
    end_error_ = error;
    record = record_;
  }
  if (record) record->end(!error, error ? detail::reason(error) : "");
}

void Work::attach(std::shared_ptr<detail::CollectiveRecord> record) {
  std::exception_ptr error;
  {
    const std::lock_guard<std::mutex> lock(record_mutex_);
    record_ = record;
    if (started_ns_ != 0) record->started_ns.store(started_ns_);
    if (!ended_) return;
    error = end_error_;
  }
  record->end(!error, error ? detail::reason(error) : "");
}

namespace detail {
namespace {

std::atomic<bool>& failed() {
  static std::atomic<bool> flag{false};
  return flag;
}

}  // namespace

void note_collective_failure() { failed().store(true); }

bool collective_failed() { return failed().load(); }

void WorkCompletion::fail(Work& work, std::exception_ptr error) {
  note_collective_failure();
  work.fail(as_datapar_error(work.what(), std::move(error)));
  flight_recorder_on_failure(work.what());
}


std::exception_ptr as_datapar_error(const std::string& what, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return error;
  } catch (const std::exception& e) {
    // The engines report a dead or silent peer as their own exception types.
    return std::make_exception_ptr(
        CommError(str_cat(what, " failed: ", e.what(), ". A peer probably exited; rebuild the process group.")));
  } catch (...) {
    return std::make_exception_ptr(CommError(str_cat(what, " failed with an unknown exception.")));
  }
}

}  // namespace detail

}  // namespace datapar
