// The processes of one attempt of `datapar launch` on this node: starts them, carries their
// output to the launcher's stdout/stderr line by line (worker_output.h), reaps them and
// signals them. It decides nothing: when to stop or restart the group is launch.cc's job.
//
// Each worker is started by detail::start_child (child_process.h): in its own process group
// (so a signal reaches whatever the worker started too), with PR_SET_PDEATHSIG = SIGKILL (so
// it dies with the launcher even when the launcher itself is SIGKILLed and gets no chance to
// clean up), stdin /dev/null.
// Caveat: PDEATHSIG covers the worker process only; children a worker forks itself die
// with the launcher only if the worker passes that on (a killpg() reaches them on every
// orderly stop).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "worker_output.h"

namespace datapar::tools {

struct WorkerSpec {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> environment;  // the whole environment, "NAME=value"
  std::vector<int> cpus;                 // the cores it may run on; empty: the launcher's
  bool tag_output = true;                // "[rank R] " before each line it prints
};

struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that ended it, or 0
  bool failed() const { return signal != 0 || exit_code != 0; }
};

// What one call of WorkerGroup::poll() saw.
struct WorkerEvents {
  std::vector<WorkerExit> exits;  // workers reaped during this call
  std::vector<int> signals;       // SIGINT / SIGTERM / SIGHUP the launcher received
};

class WorkerGroup {
 public:
  // Installs the launcher's handlers for SIGINT, SIGTERM and SIGHUP (they only record the
  // signal; poll() reports it) and ignores SIGPIPE. Call once before the first group.
  static void catch_signals();

  // Starts one worker per spec running `argv` (argv[0] is looked up on PATH if it has no
  // '/'). A worker that cannot exec prints why on its stderr and exits 127.
  // Throws Error if fork() or pipe() fails (after killing the workers already started).
  WorkerGroup(const std::vector<std::string>& argv, const std::vector<WorkerSpec>& specs);

  // SIGKILLs and reaps any worker still running.
  ~WorkerGroup();

  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Waits up to `timeout` for output, worker exits or a signal to the launcher; forwards
  // complete output lines; returns what happened.
  WorkerEvents poll(std::chrono::milliseconds timeout);

  // Sends `sig` to the process group of every worker not yet reaped.
  void signal_all(int sig);

  // Workers not yet reaped.
  int running() const;

  // True once every worker is reaped and its output read to the end (or, if a process the
  // worker left behind holds the pipe open, kDrainTimeout after the last exit).
  bool finished() const;

  static constexpr std::chrono::milliseconds kDrainTimeout{500};

 private:
  struct Stream {
    int fd = -1;
    std::unique_ptr<WorkerOutput> output;
  };

  void close_stream(Stream& s);

  std::vector<WorkerSpec> specs_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::vector<pid_t> guards_;  // Note [A launcher's death reaches the whole group] (worker_group.cc)
  std::vector<Stream> streams_;  // 2 per worker: stdout, stderr
  std::chrono::steady_clock::time_point all_reaped_at_{};
};

}  // namespace datapar::tools
