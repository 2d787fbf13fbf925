// How backends complete the Works they hand out; users only wait on them (work.h).
#pragma once

#include <chrono>
#include <exception>
#include <string>

#include "datapar/process_group/work.h"

namespace datapar::detail {

class WorkCompletion {
 public:
  // The backend begins to run `work` (for the flight recorder's start time).
  static void start(Work& work) { work.note_start(); }
  static void finish(Work& work) { work.finish(); }
  // What wait() and synchronize() wait at most when given no timeout.
  static void limit(Work& work, std::chrono::milliseconds timeout) { work.timeout_ = timeout; }
  // Fails `work` with `error` as users see errors (as_datapar_error).
  static void fail(Work& work, std::exception_ptr error);
  // The flight recorder's record of the collective `work` runs.
  static void attach(Work& work, std::shared_ptr<CollectiveRecord> record) { work.attach(std::move(record)); }
};

// An error as a process group's caller sees it: datapar's errors as they are; anything an
// engine throws (Gloo's exceptions, std::system_error, ...) as a CommError naming the
// operation `what`.
std::exception_ptr as_datapar_error(const std::string& what, std::exception_ptr error);

}  // namespace datapar::detail
