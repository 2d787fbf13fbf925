// Warnings datapar gives while a job runs (a collective that stalls, ...): one sink for all
// of them, so that a program can route them to its own log.
#pragma once

#include <functional>
#include <string>

namespace datapar {

// Receives each warning: one line, without a prefix or a newline.
using WarningSink = std::function<void(const std::string& message)>;

// Replaces the sink and returns the previous one; nullptr restores the default, which
// writes "datapar: warning: <message>" to stderr. Thread-safe.
WarningSink set_warning_sink(WarningSink sink);

// Hands `message` to the sink. Thread-safe; the sink may be called from datapar's own
// threads, one warning at a time.
void warn(const std::string& message);

}  // namespace datapar
