// Work: a collective in flight. Returned by every ProcessGroup call; wait() for its result.
#pragma once

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <string>

namespace datapar {

class Work {
 public:
  explicit Work(std::string what) : what_(std::move(what)), done_(promise_.get_future().share()) {}

  // Blocks until the operation finished, at most `timeout`; throws the operation's error
  // (CommError when a peer failed, TimeoutError when it ran past the group's timeout), or
  // TimeoutError if it is still running when `timeout` ends. Thread-safe; may be called
  // more than once.
  void wait(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365));

  // Whether the operation has finished (successfully or not). Never blocks.
  bool is_completed() const;

  const std::string& what() const { return what_; }

  // For backends: report the outcome. Exactly one of them, once.
  void finish() { promise_.set_value(); }
  void fail(std::exception_ptr error) { promise_.set_exception(std::move(error)); }

 private:
  std::string what_;
  std::promise<void> promise_;
  std::shared_future<void> done_;
};

}  // namespace datapar
