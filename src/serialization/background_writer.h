// One write at a time on a thread of its own, its failure kept until someone asks for it:
// what makes a checkpoint asynchronous (dcp::AsyncSaver, train::AsyncCheckpointWriter).
//
// A save is: begin() (waits for the write in flight, with a warning, and throws its failure
// if nobody heard of it yet), the caller's staging (copies the state into memory the write
// reads, which the previous write no longer does), start(write). A failure is reported once:
// by the next begin(), check() or wait(); failing that, the destructor warns (it cannot throw).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace datapar::detail {

class BackgroundWriter {
 public:
  BackgroundWriter();
  ~BackgroundWriter();  // waits for the write in flight
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Before staging the save of `target`: waits for the write in flight (saves come faster
  // than the disk takes them: warns, naming both), then throws its failure if unreported.
  // Returns the seconds waited.
  double begin(const std::string& target);
  // Runs `write` (of `target`) on the writer's thread; call after begin().
  void start(std::string target, std::function<void()> write);
  // Throws the failure of a write that ended and was not reported yet, without waiting.
  void check();
  // Waits for the write in flight, then check().
  void wait();
  bool busy() const;

 private:
  void run();
  void wait_idle(std::unique_lock<std::mutex>& lock);
  void rethrow_failure(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> write_;   // the write to run, or empty
  std::string target_;            // what it writes
  bool busy_ = false;             // a write is queued or running
  bool stopping_ = false;
  std::exception_ptr failure_;    // of the last write, until reported
  std::string failed_target_;
  std::thread thread_;
};

}  // namespace datapar::detail
