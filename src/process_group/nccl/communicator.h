// NcclComm: one NCCL communicator in non-blocking mode, and whether its group is still
// alive. Every call on the communicator goes through here, under one mutex: NCCL calls on
// one communicator are not thread-safe, and the watchdog thread (watchdog.h) polls it and
// may abort it while a launching thread enqueues. What an operation puts on the streams is
// process_group.cc's; when it completes is the watchdog's.
#pragma once

#include <c10/core/Device.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

// Non-blocking communicators, ncclCommInitRankConfig and ncclCommFinalize came in 2.14.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 21400  // 2.14.0
#error "datapar's nccl backend needs NCCL 2.14 or newer: set NCCL_ROOT to one and configure again."
#endif

namespace datapar::detail {

using NcclClock = std::chrono::steady_clock;

// Note [Polling NCCL]
// A non-blocking communicator tells nothing; it is asked (ncclCommGetAsyncError), and so
// is a CUDA event (cudaEventQuery). Blocking calls (cudaEventSynchronize) would have no
// deadline, and the thread that must abort a stuck communicator cannot be the one blocked.
// So the pollers yield for a few rounds (enqueues and most collectives of a step finish
// within microseconds), then sleep 10 us, doubling to 1 ms: an idle wait costs nothing,
// and a result is seen at most 1 ms late.
class PollPause {
 public:
  void operator()();
  void reset() { round_ = 0; }

 private:
  int round_ = 0;
};

class NcclComm {
 public:
  // Joins the communicator of `size` ranks named by `id` as `rank`, on `device`
  // (ncclCommInitRankConfig, non-blocking, polled until `deadline`). Throws TimeoutError
  // past the deadline, CommError when NCCL fails; the communicator is aborted then, not
  // leaked. `timeout` is the group's limit, used to bound finalization and in messages.
  NcclComm(const ncclUniqueId& id, int rank, int size, c10::DeviceIndex device, NcclClock::time_point deadline,
           std::chrono::milliseconds timeout);
  // Finalizes and destroys the communicator, unless it was aborted (which freed it).
  // REQUIRES: nothing in flight (the watchdog has drained).
  ~NcclComm();

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // "<op> on rank r of n (nccl)": how errors and Works name an operation.
  std::string describe(const std::string& op) const;

  // Runs `calls` (NCCL calls on the communicator, e.g. ncclGroupStart ... ncclGroupEnd)
  // and polls until NCCL has enqueued them, at most until `deadline`. Throws the group's
  // CommError when it is dead; on an NCCL error (CommError) or past the deadline
  // (TimeoutError) aborts the group first.
  void enqueue(const std::string& op, const std::function<ncclResult_t(ncclComm_t)>& calls,
               NcclClock::time_point deadline);

  // For the watchdog: whether NCCL reports an asynchronous error. If so, aborts the group
  // (`op` having failed) and returns NCCL's text; nullopt while all is well or when the
  // group was dead already.
  std::optional<std::string> check_async_error(const std::string& op);

  // Aborts the communicator and marks the group dead: `op` failed with `reason`. Only the
  // first call aborts; returns false when the group was dead already.
  bool abort(const std::string& op, const std::string& reason);

  bool dead() const;
  // Throws CommError(dead_message(op)) when the group is dead.
  void check_alive(const std::string& op) const;
  // "<op> on rank r of n (nccl): the nccl group was aborted after <failed op> failed: ...".
  std::string dead_message(const std::string& op) const;

 private:
  bool abort_locked(const std::string& op, const std::string& reason);
  std::string dead_message_locked(const std::string& op) const;

  const int rank_;
  const int size_;
  const c10::DeviceIndex device_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  ncclComm_t comm_ = nullptr;  // null once aborted: NCCL freed it (Note [Abort once] in communicator.cc)
  std::string failed_op_;      // set when aborted
  std::string failure_;
};

}  // namespace datapar::detail
