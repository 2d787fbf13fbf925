// PeriodicThread: a thread of its own that runs `tick` every `period` until it is stopped
// or `tick` returns false. The one loop of datapar's periodic workers (the membership
// decider, a member's heartbeat, a process group's stall inspector): a stop wakes the
// thread at once, lets a tick in progress finish, and joins it. An implementation helper
// of public classes, not an API.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace datapar::detail {

class PeriodicThread {
 public:
  PeriodicThread() = default;  // not running
  ~PeriodicThread() { stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts the thread: `tick` runs one `period` from now, then a period after each run
  // ends, until stop() or until it returns false. It must not throw. Once only.
  void start(std::chrono::milliseconds period, std::function<bool()> tick) {
    start([period] { return period; }, std::move(tick));
  }
  // As above, with `period()` asked before each wait (a period that changes: wake() makes
  // the thread ask again at once).
  void start(std::function<std::chrono::milliseconds()> period, std::function<bool()> tick) {
    thread_ = std::thread([this, period = std::move(period), tick = std::move(tick)] {
      for (;;) {
        const std::chrono::milliseconds wait = period();
        {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait_for(lock, wait, [this] { return stopping_ || woken_; });
          if (stopping_) return;
          woken_ = false;
        }
        if (!tick()) return;
      }
    });
  }

  // Ends the current wait: the tick runs now (and the period is asked anew after it).
  void wake() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      woken_ = true;
    }
    wake_.notify_all();
  }

  // Wakes the thread and waits until it ends. Idempotent; from any thread but its own.
  void stop() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mutex_
  bool woken_ = false;     // guarded by mutex_
  std::thread thread_;
};

}  // namespace datapar::detail
