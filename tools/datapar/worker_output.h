// The line prefixer of `datapar launch`: each worker's stdout and stderr arrive as raw
// bytes on a pipe; this turns them into whole lines tagged "[rank R] " so that lines of
// different workers never mix mid-line. It does no I/O of its own on the pipe: the
// launcher's poll loop reads and hands the bytes over.
//
// On a terminal, a worker's live line (a progress line redrawn in place: "\r", text, "\033[K",
// no newline; train::ProgressBar) is passed through as it is, untagged, the moment it is whole:
// tagging it, or holding it until a newline, would leave the user staring at nothing.
#pragma once

#include <string>

namespace datapar::tools {

// Buffers one stream (one worker's stdout, or its stderr) and writes every complete line,
// prefixed, to `out_fd` with a single write() per line (so lines from different workers,
// written by the one launcher thread, stay whole even when out_fd is shared).
// Not thread-safe; one per stream.
class WorkerOutput {
 public:
  // live: out_fd is a terminal, where live lines pass through (above).
  WorkerOutput(std::string prefix, int out_fd, bool live = false)
      : prefix_(std::move(prefix)), out_fd_(out_fd), live_(live) {}

  // Appends `n` bytes and writes the lines they complete. A line longer than
  // kMaxLineBytes is written in pieces, each with the prefix, so a worker that never
  // prints a newline cannot make the launcher buffer without bound.
  void add(const char* data, size_t n);

  // Writes a partial last line (no newline yet) with a newline added. Call at EOF.
  void flush();

  static constexpr size_t kMaxLineBytes = 64 * 1024;

 private:
  void write_line(const char* data, size_t n);

  // live_: writes the pending bytes up to the last whole live line (ending "\033[K") as they are.
  void pass_live_line();

  std::string prefix_;
  int out_fd_;
  bool live_;
  std::string pending_;  // bytes after the last newline
};

}  // namespace datapar::tools
