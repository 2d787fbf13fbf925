// See warning.h.
#include "datapar/warning.h"

#include <cstdio>
#include <mutex>
#include <utility>

namespace datapar {
namespace {

struct Sink {
  std::mutex mutex;  // held while the sink runs: one warning at a time
  WarningSink sink;
};

Sink& sink() {
  static Sink* s = new Sink;  // never destroyed: threads may warn while the program exits
  return *s;
}

}  // namespace

WarningSink set_warning_sink(WarningSink replacement) {
  std::lock_guard<std::mutex> lock(sink().mutex);
  return std::exchange(sink().sink, std::move(replacement));
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(sink().mutex);
  if (sink().sink) {
    sink().sink(message);
  } else {
    std::fprintf(stderr, "datapar: warning: %s\n", message.c_str());
  }
}

}  // namespace datapar
