// Running a job of real processes from a test: start them, wait with a deadline, kill the
// rest if it passes, and read what each printed.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.h"

namespace datapar::testing {

struct ProcessResult {
  int exit_code = -1;  // -1: did not exit normally
  int signal = 0;      // the signal that ended it, if any
  std::string output;  // stdout and stderr together
};

// Runs `command` with sh and waits for it; its stdout and stderr come back together.
inline ProcessResult run_shell(const std::string& command) {
  ProcessResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

// Starts `argv` with its stdout and stderr to the file `log` (created or truncated);
// returns its pid, or -1.
inline pid_t start_logged(const std::vector<std::string>& argv, const std::string& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  detail::ChildOptions options;
  options.stdout_fd = fd;
  options.stderr_fd = fd;
  const pid_t pid = detail::start_child(argv, options);
  ::close(fd);
  return pid;
}

// A shell's view of how a process ended: its exit code, or 128 + the signal that ended it.
inline int exit_status(const detail::ChildExit& exit) {
  return exit.signal != 0 ? 128 + exit.signal : exit.exit_code;
}

// Runs every argv in `commands` at once, output to files under `dir`; waits until all
// have ended or `deadline` has passed (then kills what is left: exit_code stays -1).
inline std::vector<ProcessResult> run_processes(const std::vector<std::vector<std::string>>& commands,
                                                const std::string& dir, std::chrono::seconds deadline,
                                                bool* timed_out = nullptr) {
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (size_t i = 0; i < commands.size(); ++i) {
    logs.push_back(dir + "/process-" + std::to_string(i) + ".log");
    pids.push_back(start_logged(commands[i], logs.back()));
  }
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::vector<ProcessResult> results(commands.size());
  if (timed_out) *timed_out = false;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] < 0) continue;
    const detail::ChildExit exit = detail::wait_child(pids[i], end);
    results[i].exit_code = exit.exit_code;
    results[i].signal = exit.timed_out ? 0 : exit.signal;
    if (timed_out) *timed_out |= exit.timed_out;
  }
  for (size_t i = 0; i < logs.size(); ++i) {
    std::ifstream in(logs[i]);
    std::stringstream text;
    text << in.rdbuf();
    results[i].output = text.str();
  }
  return results;
}

}  // namespace datapar::testing
