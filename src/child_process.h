// Starting programs and waiting for processes: the one unit for every place that does it
// (the launcher's workers, the tools' ranks, gnuplot, the tests' jobs). Torch-free.
//
// A child is made with fork() and, for a program, exec: between the two it makes only
// async-signal-safe calls, since the parent may have many threads (a trainer, a test
// binary); everything it needs is prepared before the fork.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace datapar::detail {

// The path execvp would run for `program` (looked up on PATH, then in `also_in`, when it
// has no '/'), or "" if that is not an executable file.
std::string find_executable(const std::string& program, const std::vector<std::string>& also_in = {});

// The path of this program's own executable (/proc/self/exe), or "" if it cannot be read.
std::string this_program();

struct ChildOptions {
  // The whole environment, "NAME=value"; nullopt: this process's.
  std::optional<std::vector<std::string>> environment;
  // Descriptors the child gets as stdin (-1: /dev/null), stdout and stderr (-1: this
  // process's).
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // A process group of its own, so that a signal to the group reaches whatever the child
  // starts too (the parent sets it as well, so it exists when start_child returns).
  bool own_process_group = true;
  // SIGKILLed when this process dies, however it dies (PR_SET_PDEATHSIG); a child whose
  // parent is already gone exits at once.
  bool die_with_parent = true;
  // The cores it may run on; empty: this process's.
  std::vector<int> cpus;
  // Who says "cannot run PROGRAM: why" on the child's stderr when exec fails (exit 127).
  std::string who = "datapar";
};

// Starts `argv` (argv[0] looked up on PATH when it has no '/') with default signal
// handling and an empty signal mask. Returns its pid, or -1 with errno set if fork failed.
pid_t start_child(const std::vector<std::string>& argv, const ChildOptions& options = {});

// How a child ended.
struct ChildExit {
  int exit_code = -1;      // -1: it did not exit normally
  int signal = 0;          // the signal that ended it, if any
  bool timed_out = false;  // killed at the deadline
  int64_t peak_resident_bytes = 0;  // the child's peak resident memory (its ru_maxrss)
  bool succeeded() const { return exit_code == 0; }
};

// Waits for `pid` to end; past `deadline`, SIGKILLs it (and its process group, when it leads
// one) and reaps it.
ChildExit wait_child(pid_t pid, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

// Runs body() in a forked child (no exec), which exits with what body returns, or with 1
// after printing what it threw as "<who>: <what>". Returns its pid, or -1 with errno set.
// Only for code that starts no thread pool before the fork (a forked child of a process
// whose OpenMP or Gloo threads have started may hang in them): the forked child has this
// process's memory but only the forking thread.
pid_t fork_child(const std::function<int()>& body, const std::string& who = "datapar");

// Runs rank_main(rank) in `n` forked processes (no exec: for code that starts no thread pool
// before the fork), each exiting with what it returns, or 1 after printing what it threw as
// "<who>: rank R: <what>"; waits for all of them.
std::vector<ChildExit> fork_ranks(int n, const std::function<int(int)>& rank_main, const std::string& who);

}  // namespace datapar::detail
