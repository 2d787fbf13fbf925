// Running a job of real processes from a test: start them, wait with a deadline, kill the
// rest if it passes, and read what each printed.
#pragma once

#include <signal.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

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
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> argv;
    for (const std::string& a : commands[i]) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }
  std::vector<ProcessResult> results(commands.size());
  std::vector<bool> done(commands.size(), false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  size_t remaining = commands.size();
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] < 0) done[i] = true, --remaining;
  }
  while (remaining > 0 && std::chrono::steady_clock::now() < end) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || ::waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      done[i] = true;
      --remaining;
      if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (timed_out) *timed_out = remaining > 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    ::kill(pids[i], SIGKILL);
    ::waitpid(pids[i], nullptr, 0);
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
