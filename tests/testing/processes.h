// Running a job of real processes from a test: start them, wait with a deadline, kill the
// rest if it passes, and read what each printed.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
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

// Runs every argv in `commands` at once, output to files under `dir`; waits until all
// have ended or `deadline` has passed (then kills what is left: exit_code stays -1).
inline std::vector<ProcessResult> run_processes(const std::vector<std::vector<std::string>>& commands,
                                                const std::string& dir, std::chrono::seconds deadline,
                                                bool* timed_out = nullptr) {
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (size_t i = 0; i < commands.size(); ++i) {
    logs.push_back(dir + "/process-" + std::to_string(i) + ".log");
    const int log = ::open(logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    detail::ChildOptions options;
    options.stdout_fd = log;
    options.stderr_fd = log;
    pids.push_back(log >= 0 ? detail::start_child(commands[i], options) : -1);
    if (log >= 0) ::close(log);
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
