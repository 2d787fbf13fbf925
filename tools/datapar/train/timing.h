// The trainer's clock: seconds since a point, for its reports and timelines.
#pragma once

#include <chrono>

namespace datapar::tools {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace datapar::tools
