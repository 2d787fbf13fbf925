// One write at a time in the background. See background_writer.h.
#include "serialization/background_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

#include "datapar/error.h"
#include "datapar/warning.h"

namespace datapar::detail {

BackgroundWriter::BackgroundWriter() : thread_([this] { run(); }) {}

BackgroundWriter::~BackgroundWriter() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  stopping_ = true;
  changed_.notify_all();
  if (failure_) {  // nobody asked: the last word on it
    try {
      std::rethrow_exception(failure_);
    } catch (const std::exception& e) {
      warn(str_cat("the checkpoint ", failed_target_, " was not written, and nothing reported it: ", e.what()));
    } catch (...) {
      warn(str_cat("the checkpoint ", failed_target_, " was not written, and nothing reported it."));
    }
  }
  lock.unlock();
  thread_.join();
}

void BackgroundWriter::run() {
  // At the lowest priority: on a machine whose cores the training keeps busy (CPU training),
  // the write takes what they leave rather than slowing their steps. It then takes longer
  // (a 143 M-parameter MLP's 817 MiB: 82 s at nice 19, 12-15 s at nice 10, which cost the
  // steps 15% of their pace); nothing waits for it, and a save that must wait for it blocks
  // its own thread, which frees that core for the write (docs/benchmarks.md, "Checkpoints
  // written in the background"). A GPU's training leaves the host's cores to it anyway.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || write_; });
    if (!write_) return;  // stopping, nothing queued
    std::function<void()> write = std::move(write_);
    write_ = nullptr;
    const std::string target = target_;
    lock.unlock();
    std::exception_ptr failure;
    try {
      write();
    } catch (...) {
      failure = std::current_exception();
    }
    write = nullptr;  // what it held (the staged state) goes before the writer is idle
    lock.lock();
    if (failure) {
      failure_ = failure;
      failed_target_ = target;
    }
    busy_ = false;
    changed_.notify_all();
  }
}

void BackgroundWriter::wait_idle(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [this] { return !busy_; });
}

void BackgroundWriter::rethrow_failure(std::unique_lock<std::mutex>& lock) {
  if (!failure_) return;
  const std::exception_ptr failure = failure_;
  const std::string target = failed_target_;
  failure_ = nullptr;
  lock.unlock();
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    throw CheckpointError(str_cat("the checkpoint ", target, " was not written (it was being written in the ",
                                  "background): ", e.what(), " The checkpoint before it is unchanged."));
  }
}

double BackgroundWriter::begin(const std::string& target) {
  std::unique_lock<std::mutex> lock(mutex_);
  double waited = 0;
  if (busy_) {
    warn(str_cat("the checkpoint ", target, " waits for the write of ", target_,
                 ", still in flight: checkpoints come faster than they are written (one is written at a time)."));
    const auto start = std::chrono::steady_clock::now();
    wait_idle(lock);
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  rethrow_failure(lock);
  return waited;
}

void BackgroundWriter::start(std::string target, std::function<void()> write) {
  std::unique_lock<std::mutex> lock(mutex_);
  DATAPAR_CHECK(!busy_, "BackgroundWriter::start: a write is in flight; call begin() first.");
  target_ = std::move(target);
  write_ = std::move(write);
  busy_ = true;
  changed_.notify_all();
}

void BackgroundWriter::check() {
  std::unique_lock<std::mutex> lock(mutex_);
  rethrow_failure(lock);
}

void BackgroundWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  rethrow_failure(lock);
}

bool BackgroundWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_;
}

}  // namespace datapar::detail
