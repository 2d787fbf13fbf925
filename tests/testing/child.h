// Running a piece of a test in a forked child, to see how it ends and what it costs: a
// parser fed a hostile input must fail fast and in bounded memory, and a crash or runaway
// must fail the test, not take the test binary down with it.
//
// Only for code that uses no thread pool (a forked child of a process whose OpenMP pool
// has started may hang in it): parsers, file reading, small tensor setup.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

namespace datapar::testing {

struct ChildOutcome {
  bool exited = false;         // returned from the function (else: a signal ended it)
  int signal = 0;              // SIGSEGV for a crash, SIGALRM for the time limit
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
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(limit_seconds);
    const std::string message = fn();
    for (size_t done = 0; done < message.size();) {
      const ssize_t n = ::write(fds[1], message.data() + done, message.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    std::_Exit(0);
  }
  ::close(fds[1]);
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) out.message.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.exited = WIFEXITED(status);
  out.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  out.memory_growth = int64_t{usage.ru_maxrss} * 1024 - before;  // ru_maxrss is in KiB
  return out;
}

}  // namespace datapar::testing
