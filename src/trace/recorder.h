// The process-wide recorder behind trace.h, and what the library's own instrumentation
// (process group runners, the reducer) records through it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "datapar/trace.h"

namespace datapar::trace::detail {

// One event. Names are string literals, except a collective's (`text`).
struct Event {
  const char* name = nullptr;  // null: `text` is the name
  std::string text;
  const char* category = "";
  char phase = 'X';            // 'X': a span [at, at + duration); 'i': a moment
  Clock::time_point at;
  Clock::duration duration{0};
  uint32_t thread = 0;         // row, an index into Recording::threads
  int64_t step = -1;
  // A collective's: what it reduced (kind "bucket" and its index, -1 if none), its bytes, and
  // when it was queued (at <= started).
  const char* kind = nullptr;
  int64_t index = -1;
  int64_t bytes = -1;
  Clock::time_point queued;
};

// What a recording holds when it stops.
struct Recording {
  Clock::time_point origin;                          // when it started
  std::chrono::system_clock::time_point wall_origin;  // the same moment on the wall clock
  std::vector<Event> events;
  std::vector<std::string> threads;  // row names by index
  int64_t dropped = 0;               // events past the cap (kMaxEvents)
};

// Events kept per recording: ~1 GiB at worst; later ones are counted, not kept.
inline constexpr size_t kMaxEvents = size_t{8} << 20;

// Stops recording and hands over what it holds. InvalidArgumentError if it was off.
Recording stop(const char* caller);

// For the calling thread's next collective: what DDP bucket it carries. Scoped, per thread.
class CollectiveLabel {
 public:
  CollectiveLabel(const char* kind, int64_t index, int64_t bytes) noexcept;
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  const char* kind_;
  int64_t index_, bytes_;
};

// Taken where a collective is queued, on the caller's thread; `on` is false when recording
// was off then, and nothing is recorded for it.
struct Queued {
  bool on = false;
  Clock::time_point at;
  int64_t step = -1;
  uint32_t thread = 0;  // the queuing thread's row
  const char* kind = nullptr;
  int64_t index = -1;
  int64_t bytes = -1;
};
Queued queued() noexcept;

// Who on this thread issues collectives now, by its CollectiveLabel ("bucket 3"), whether or
// not a trace is recorded: the flight recorder's site of a collective; "" if none.
std::string collective_site();

// Where the collective ran: a span named `what` on the calling thread, [started, finished),
// and a moment "queue <kind> <index>" on the queuing thread's row for labelled ones.
void record_collective(const Queued& queued, const std::string& what, Clock::time_point started,
                       Clock::time_point finished) noexcept;

// Writes `recording` as Chrome trace events, comma-separated, as process `rank`, with every
// time shifted by `shift` (to a job-wide origin). Includes the row names.
std::string events_json(const Recording& recording, int rank, Clock::duration shift);

// trace::save of a process outside a job: stops recording and writes its own events.
void save_alone(const std::string& path);

}  // namespace datapar::trace::detail
