// A test program that crashes on a machine we cannot log in to (a GPU node, scripts/
// gpu_check.sh) must leave more than "SEGFAULT" in its log: line-buffered stdout, so that
// Google Test's lines up to the crash are not lost in the buffer, and on a fatal signal the
// signal and the stack, then the default action (the exit status stays the signal's).
#pragma once

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace datapar::testing {

inline void write_crash_report(int signal) {
  // Not all async-signal-safe (snprintf, strsignal), which is acceptable for a report written
  // once on the way down; backtrace() is safe once it has run (install_crash_report calls it).
  char line[64];
  std::snprintf(line, sizeof line, "\nfatal signal %d (%s); the stack:\n", signal, ::strsignal(signal));
  (void)!::write(STDERR_FILENO, line, std::strlen(line));
  void* frames[64];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), STDERR_FILENO);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

inline void install_crash_report() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads libgcc now, not inside the handler
  for (const int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(signal, write_crash_report);
}

}  // namespace datapar::testing
