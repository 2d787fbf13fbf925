#include "process_group/ordered_runner.h"

#include "datapar/error.h"

namespace datapar::detail {

OrderedRunner::OrderedRunner(std::string backend) : backend_(std::move(backend)) {
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(work, std::move(op));
  }
  wake_.notify_one();
  return work;
}

void OrderedRunner::loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    auto [work, op] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      op();
      work->finish();
    } catch (const datapar::Error&) {
      work->fail(std::current_exception());
    } catch (const std::exception& e) {
      // The engines report a dead or silent peer as their own exception types.
      work->fail(std::make_exception_ptr(CommError(str_cat(
          work->what(), " failed: ", e.what(), ". A peer probably exited; rebuild the process group."))));
    }
  }
}

}  // namespace datapar::detail
