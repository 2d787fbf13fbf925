// OrderedRunner: one thread that runs a process group's operations one after another, in
// the order they were queued, each completing its Work. Collective libraries match
// operations by order, so one group's collectives must never interleave or reorder.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "datapar/process_group/work.h"
#include "trace/recorder.h"

namespace datapar::detail {

class OrderedRunner {
 public:
  // `name`: the thread's row in a trace (trace.h), e.g. "gloo collectives".
  explicit OrderedRunner(std::string name);
  // Runs what is still queued, then stops.
  ~OrderedRunner();

  OrderedRunner(const OrderedRunner&) = delete;
  OrderedRunner& operator=(const OrderedRunner&) = delete;

  // Queues `op`; its Work finishes when op returns and fails with what op throws
  // (as_datapar_error in work_completion.h).
  std::shared_ptr<Work> push(std::string what, std::function<void()> op);
  // The same for a Work the caller made (a subclass of its own).
  void push(std::shared_ptr<Work> work, std::function<void()> op);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;
  struct Entry {
    std::shared_ptr<Work> work;
    std::function<void()> op;
    trace::detail::Queued queued;
  };
  std::deque<Entry> queue_;
  const std::string name_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace datapar::detail
