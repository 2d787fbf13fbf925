// See communicator.h.
//
// Note [Non-blocking communicator]
// The communicator is made with config.blocking = 0, so that no NCCL call can block a
// thread without limit: ncclCommInitRankConfig waiting for a rank that never comes, an
// enqueue waiting for a peer to connect. Such a call returns ncclInProgress and goes on in
// the background; ncclCommGetAsyncError says ncclInProgress until it is done, then
// ncclSuccess or the error. Nothing else may be called on the communicator meanwhile, and
// the end event of an operation must not be recorded before its enqueue is done (its
// kernels are not on the stream yet), so every call is polled to completion here, under
// the group's deadline. Only ncclCommAbort and ncclCommDestroy block.
//
// Note [Abort once]
// ncclCommAbort frees the communicator: after it, the handle must not be used at all, not
// for ncclGetLastError, not for ncclCommDestroy. So abort happens under the mutex, at most
// once, and sets comm_ to null; every later use finds the group dead and throws. The
// destructor destroys only a communicator that was never aborted.
#include "process_group/nccl/communicator.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <thread>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

// The communicator's state: ncclInProgress, ncclSuccess or its error.
ncclResult_t async_state(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  const ncclResult_t call = ncclCommGetAsyncError(comm, &state);
  return call != ncclSuccess ? call : state;
}

// NCCL's words for a failure. Call before aborting: the last error needs the communicator.
std::string error_text(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return last != nullptr && *last != '\0' ? str_cat(ncclGetErrorString(result), " (", last, ")")
                                          : std::string(ncclGetErrorString(result));
}

double seconds(std::chrono::milliseconds duration) { return std::chrono::duration<double>(duration).count(); }

}  // namespace

void PollPause::operator()() {
  constexpr int kYields = 32;
  if (round_ < kYields) {
    ++round_;
    std::this_thread::yield();
    return;
  }
  const int doublings = std::min(round_++ - kYields, 7);  // 10 us << 7 = 1.28 ms
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 << doublings)));
}

NcclComm::NcclComm(const ncclUniqueId& id, int rank, int size, c10::DeviceIndex device,
                   NcclClock::time_point deadline, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), device_(device), timeout_(timeout) {
  // NCCL binds the communicator to the current device; the guard gives the caller's back.
  c10::cuda::CUDAGuard guard(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Note [Non-blocking communicator]
  ncclResult_t state = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  if (state == ncclSuccess && comm_ != nullptr) state = async_state(comm_);  // done, or still going
  PollPause pause;
  while (state == ncclInProgress && comm_ != nullptr) {
    if (NcclClock::now() > deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw TimeoutError(str_cat(
          "ProcessGroup(nccl): rank ", rank_, " of ", size_, " on cuda:", static_cast<int>(device_),
          ": ncclCommInitRankConfig was not done within the group's timeout (", seconds(timeout_),
          " s), although all ", size_,
          " ranks had checked in to the store. NCCL could not connect them: check NCCL_SOCKET_IFNAME and the "
          "firewall, and run with NCCL_DEBUG=INFO; or raise the timeout."));
    }
    pause();
    state = async_state(comm_);
  }
  if (state != ncclSuccess) {
    const std::string text = error_text(state, comm_);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw CommError(str_cat("ProcessGroup(nccl): rank ", rank_, " of ", size_, " on cuda:", static_cast<int>(device_),
                            ": ncclCommInitRankConfig failed: ", text,
                            ". Run with NCCL_DEBUG=INFO for details; does every rank have its own GPU?"));
  }
}

NcclComm::~NcclComm() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_ == nullptr) return;  // aborted, which freed it (Note [Abort once])
  // A destructor cannot report; a CUDA error here (the process is likely exiting) must
  // not terminate it.
  try {
    c10::cuda::CUDAGuard guard(device_);
    // Finalize completes what NCCL still owes the peers and synchronizes with them (every
    // rank destroys the group); polled, so that a dead or absent peer costs at most the
    // timeout, after which abort frees the communicator without waiting.
    const NcclClock::time_point deadline = NcclClock::now() + timeout_;
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclSuccess) state = async_state(comm_);
    PollPause pause;
    while (state == ncclInProgress && NcclClock::now() < deadline) {
      pause();
      state = async_state(comm_);
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  } catch (...) {
  }
  comm_ = nullptr;
}

std::string NcclComm::describe(const std::string& op) const {
  return str_cat(op, " on rank ", rank_, " of ", size_, " (nccl)");
}

void NcclComm::enqueue(const std::string& op, const std::function<ncclResult_t(ncclComm_t)>& calls,
                       NcclClock::time_point deadline) {
  ncclResult_t state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) throw CommError(dead_message_locked(op));
    state = calls(comm_);
  }
  // Note [Non-blocking communicator]. The mutex is let go between polls, so that the
  // watchdog can still abort the group meanwhile.
  PollPause pause;
  while (state == ncclInProgress) {
    if (NcclClock::now() > deadline) {
      const std::string reason =
          str_cat("NCCL was still enqueuing it after the group's timeout (", seconds(timeout_), " s)");
      if (!abort(op, reason)) throw CommError(dead_message(op));
      throw TimeoutError(str_cat(describe(op), ": ", reason,
                                 "; a peer is missing or stuck. The nccl group was aborted; make a new group."));
    }
    pause();
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) throw CommError(dead_message_locked(op));
    state = async_state(comm_);
  }
  if (state == ncclSuccess) return;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) throw CommError(dead_message_locked(op));
    reason = error_text(state, comm_);
    abort_locked(op, reason);
  }
  throw CommError(str_cat(describe(op), " failed: ", reason,
                          ". The nccl group was aborted; make a new group (a peer probably exited)."));
}

std::optional<std::string> NcclComm::check_async_error(const std::string& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_ == nullptr) return std::nullopt;
  const ncclResult_t state = async_state(comm_);
  if (state == ncclSuccess || state == ncclInProgress) return std::nullopt;
  std::string reason = error_text(state, comm_);
  abort_locked(op, reason);
  return reason;
}

bool NcclComm::abort(const std::string& op, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_locked(op, reason);
}

bool NcclComm::abort_locked(const std::string& op, const std::string& reason) {
  if (comm_ == nullptr) return false;  // Note [Abort once]
  // No device guard, which could throw with the communicator half aborted: NCCL switches
  // to the communicator's device itself, whichever thread aborts (ProcessGroup::abort may come from any).
  ncclCommAbort(comm_);  // stops the group's kernels, so its stream moves on
  comm_ = nullptr;
  failed_op_ = op;
  failure_ = reason;
  return true;
}

bool NcclComm::dead() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comm_ == nullptr;
}

void NcclComm::check_alive(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_ == nullptr) throw CommError(dead_message_locked(op));
}

std::string NcclComm::dead_message(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dead_message_locked(op);
}

std::string NcclComm::dead_message_locked(const std::string& op) const {
  return str_cat(describe(op), ": the nccl group was aborted after ", failed_op_, " failed: ", failure_,
                 "; make a new group.");
}

}  // namespace datapar::detail
