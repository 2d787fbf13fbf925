// A timeline of every training step, in the Chrome trace format (Perfetto, chrome://tracing).
//
//   datapar::trace::start();                 // on every rank, before training
//   for (...) {
//     datapar::trace::set_step(step);
//     { datapar::trace::Span s("forward", "step"); ... }
//     ...
//   }
//   datapar::trace::save("run.json");        // every rank: rank 0 writes all ranks' events
//
// What is recorded: the spans the program opens (datapar train opens data wait, forward,
// backward, optimizer step, evaluation and checkpoint), and by the library itself every
// collective a process group runs (from the moment it starts on the group's thread until it
// finished, with the moment it was queued), named for its DDP bucket when it carries one,
// and DDP's wait for its buckets at the end of backward. Every event has its rank and step.
//
// Off (the default), every instrumented place costs one relaxed atomic load. On, an event
// costs two clock reads and a short critical section; nothing is written until save().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace datapar {
class Store;  // datapar/rendezvous/store.h
}  // namespace datapar

namespace datapar::trace {

using Clock = std::chrono::steady_clock;

// Starts recording in this process. InvalidArgumentError if it is on already.
void start();

// Whether recording is on. Cheap enough for any hot path.
bool enabled() noexcept;

// The step that every later event of this process carries (-1 before the first).
void set_step(int64_t step) noexcept;

// Names the calling thread's row in the timeline ("main", "gloo collectives").
void name_thread(const std::string& name);

// A moment on the calling thread's row, named `text` ("stragglers: 0.99, 1.52; rank 1"):
// something the program found out, at the time it did. `category` must outlive the trace.
void mark(const std::string& text, const char* category) noexcept;

// An event on the calling thread from construction to destruction. `name` and `category`
// must outlive the recording (string literals).
class Span {
 public:
  Span(const char* name, const char* category) noexcept;
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  Clock::time_point start_;
  bool on_;
};

// Stops recording and writes the timeline to `path` (atomically). In a process group job
// (is_initialized()) every rank must call it: each sends its events through the job's store
// and rank 0 writes one file with all of them, a row group per rank; the others write
// nothing. Outside a job the process writes its own. Throws InvalidArgumentError when
// recording is off, CheckpointError when the file cannot be written, and the store's
// errors (TimeoutError naming the ranks) when a rank never sends its events.
void save(const std::string& path);

// The same for a job of `world` ranks that meets through `store` (keys "datapar/trace/..."),
// this process being `rank`: every rank calls it; rank 0 writes the file. For a job that is
// not the default group's (save() above uses the default group's store, rank and size).
void save(const std::string& path, Store& store, int rank, int world);

// Stops recording and returns this process's events as a complete Chrome trace document
// (`rank` as its process), without writing anything: for tests and for programs that
// ship the timeline themselves.
std::string stop_to_json(int rank = 0);

}  // namespace datapar::trace
