// Running a piece of a test in a forked child, to see how it ends and what it costs: a
// parser fed a hostile input must fail fast and in bounded memory, and a crash or runaway
// must fail the test, not take the test binary down with it.
//
// Only for code that uses no thread pool (a forked child of a process whose OpenMP pool
// has started may hang in it): parsers, file reading, small tensor setup.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "child_process.h"  // src/

namespace datapar::testing {

struct ChildOutcome {
  bool exited = false;         // returned from the function (else: a signal ended it)
  int signal = 0;              // SIGSEGV for a crash, SIGKILL at the time limit
  std::string message;         // what the function returned
  double seconds = 0;
  int64_t memory_growth = 0;   // peak resident memory of the child minus the parent's at the fork (bytes)
};

// Resident memory of this process now, in bytes.
inline int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// Runs fn() in a forked child killed after `limit_seconds`; fn's return value comes back as
// `message` (return e.what() from a catch to check an error).
inline ChildOutcome run_in_child(const std::function<std::string()>& fn, unsigned limit_seconds) {
  ChildOutcome out;
  int fds[2];
  if (::pipe(fds) != 0) return out;
  const int64_t before = resident_bytes();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = detail::fork_child([&] {
    ::close(fds[0]);
    const std::string message = fn();
    for (size_t done = 0; done < message.size();) {
      const ssize_t n = ::write(fds[1], message.data() + done, message.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    return 0;
  });
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return out;
  }
  // The message is read as the child writes it, so the child is killed at the limit
  // whether or not it has written.
  std::string message;
  const auto deadline = start + std::chrono::seconds(limit_seconds);
  std::thread reader([&] {
    char buffer[4096];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, static_cast<size_t>(n));
  });
  const detail::ChildExit exit = detail::wait_child(pid, deadline);
  reader.join();  // the pipe's write end closed with the child
  ::close(fds[0]);
  out.message = std::move(message);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.exited = exit.exit_code >= 0;
  out.signal = exit.signal;
  out.memory_growth = exit.peak_resident_bytes - before;
  return out;
}

}  // namespace datapar::testing
