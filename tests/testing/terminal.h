// Running a program on a pseudo-terminal from a test, as a user at a terminal (or `script`,
// tmux) would: what it prints there and when each piece arrived, so a test can check a line
// redrawn in place with '\r'.
#pragma once

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace datapar::testing {

struct TerminalRun {
  int exit_code = -1;  // -1: did not exit normally (or was killed at the deadline)
  std::string output;  // stdout and stderr together, as the terminal got them
  // Each read from the terminal: seconds since the start, and the bytes read.
  std::vector<std::pair<double, std::string>> pieces;
};

// Runs `argv` (argv[0] a path) with a pseudo-terminal as its stdin, stdout and stderr,
// 200 columns wide; kills it when `deadline` passes.
inline TerminalRun run_in_terminal(const std::vector<std::string>& argv, std::chrono::seconds deadline) {
  TerminalRun run;
  winsize size{};
  size.ws_row = 50;
  size.ws_col = 200;
  int terminal = -1;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::forkpty(&terminal, nullptr, nullptr, &size);
  if (pid < 0) return run;
  if (pid == 0) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  char buffer[4096];
  for (;;) {
    const double left = std::chrono::duration<double>(deadline).count() - seconds();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{terminal, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    const ssize_t n = ::read(terminal, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO: the program and everything it started closed the terminal
    run.output.append(buffer, static_cast<size_t>(n));
    run.pieces.emplace_back(seconds(), std::string(buffer, static_cast<size_t>(n)));
  }
  ::close(terminal);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && run.exit_code == -1 && seconds() < std::chrono::duration<double>(deadline).count()) {
    run.exit_code = WEXITSTATUS(status);
  }
  return run;
}

}  // namespace datapar::testing
