// See work.h and process_group.h.
#include "datapar/process_group/process_group.h"

#include "datapar/error.h"

namespace datapar {

void Work::wait(std::chrono::milliseconds timeout) {
  if (!is_completed() && wait_on_stream()) return;
  synchronize(timeout);
}

void Work::synchronize(std::chrono::milliseconds timeout) {
  if (!is_completed()) (void)wait_on_stream();
  if (done_.wait_for(timeout) != std::future_status::ready) {
    throw TimeoutError(detail::str_cat(what_, ": not finished after ", std::chrono::duration<double>(timeout).count(),
                                       " s. Did every process issue the same collectives in the same order?"));
  }
  done_.get();  // rethrows the operation's error
}

bool Work::is_completed() const { return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

}  // namespace datapar
