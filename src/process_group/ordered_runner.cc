#include "process_group/ordered_runner.h"

#include <exception>

#include "process_group/work_completion.h"

namespace datapar::detail {
namespace {

// The operation without the " on rank 0 of 2 (...)" that its errors carry: the trace row
// says the rank already.
std::string trace_name(const std::string& what) { return what.substr(0, what.find(" on rank ")); }

}  // namespace

OrderedRunner::OrderedRunner(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { loop(); });
}

OrderedRunner::~OrderedRunner() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_ptr<Work> OrderedRunner::push(std::string what, std::function<void()> op) {
  auto work = std::make_shared<Work>(std::move(what));
  push(work, std::move(op));
  return work;
}

void OrderedRunner::push(std::shared_ptr<Work> work, std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(work), std::move(op), trace::detail::queued()});
  }
  wake_.notify_one();
}

void OrderedRunner::loop() {
  try {
    trace::name_thread(name_);
  } catch (...) {
  }
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const trace::Clock::time_point started = entry.queued.on ? trace::Clock::now() : trace::Clock::time_point{};
    std::exception_ptr error;
    WorkCompletion::start(*entry.work);
    try {
      entry.op();
      if (entry.queued.on) trace::detail::record_collective(entry.queued, trace_name(entry.work->what()), started, trace::Clock::now());
    } catch (...) {
      error = std::current_exception();
    }
    // The operation's captures (the caller's tensors) go before its Work completes: once
    // wait() returns, the group holds none of them, so the caller frees them whenever it
    // drops them, never this thread afterwards. (Releasing them here after the caller had
    // let go deleted the caller's tensors on this thread, through libtorch's own reference
    // counts, which ThreadSanitizer cannot see: a race report in SharedMemory's tests.)
    entry.op = nullptr;
    if (error) {
      WorkCompletion::fail(*entry.work, error);
    } else {
      WorkCompletion::finish(*entry.work);
    }
  }
}

}  // namespace datapar::detail
