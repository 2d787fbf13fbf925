// PeriodicThread: a thread of its own that runs `tick` every `period` until it is stopped
// or `tick` returns false. The one loop of datapar's periodic workers (the membership
// decider, a member's heartbeat): a stop wakes the thread at once, lets a tick in progress
// finish, and joins it. An implementation helper of public classes, not an API.
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
    thread_ = std::thread([this, period, tick = std::move(tick)] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
        lock.unlock();
        const bool again = tick();
        lock.lock();
        if (!again) return;
      }
    });
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
  std::thread thread_;
};

}  // namespace datapar::detail
