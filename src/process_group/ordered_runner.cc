#include "process_group/ordered_runner.h"

#include "process_group/work_completion.h"

namespace datapar::detail {

OrderedRunner::OrderedRunner() {
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
      WorkCompletion::finish(*work);
    } catch (...) {
      WorkCompletion::fail(*work, std::current_exception());
    }
  }
}

}  // namespace datapar::detail
