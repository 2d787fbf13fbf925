// Jobs started the way users start them without `datapar launch` (their own mpirun, Slurm's
// srun): a command in its own process group, with a few variables added to the test's
// environment, ended at a deadline together with everything it started.
#pragma once

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <regex>

#include "testing/processes.h"
#include "testing/text.h"

namespace datapar::testing {

struct JobResult : ProcessResult {
  bool timed_out = false;  // killed at the deadline
  double seconds = 0;      // from start to end
};

// The path of `name` on PATH, else in /usr/sbin or /sbin (daemons); "" if none is executable.
inline std::string find_program(const std::string& name) {
  return detail::find_executable(name, {"/usr/sbin", "/sbin"});
}

// This process's environment with `extra` ("NAME=value") added or replacing what it sets.
inline std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& x : extra) replaced |= x.rfind(name, 0) == 0;
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Starts `argv` (argv[0] a path) in a process group of its own with `environment`, its
// output to `log`; it is SIGKILLed if this process dies first. Returns its pid (the
// group's id), or -1.
inline pid_t start_in_own_group(const std::vector<std::string>& argv, const std::vector<std::string>& environment,
                                const std::string& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  detail::ChildOptions options;
  options.environment = environment;
  options.stdout_fd = fd;
  options.stderr_fd = fd;
  const pid_t pid = detail::start_child(argv, options);
  ::close(fd);
  return pid;
}

// Runs `argv` with `extra` variables to its end or to `deadline`, when it and its process
// group are SIGKILLed; what is left of the group is SIGKILLed in either case.
inline JobResult run_job(const std::vector<std::string>& argv, const std::vector<std::string>& extra,
                         const std::string& log, std::chrono::seconds deadline) {
  JobResult r;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = start_in_own_group(argv, environment_with(extra), log);
  if (pid < 0) {
    r.output = "could not start " + argv[0] + ": " + std::strerror(errno);
    return r;
  }
  const detail::ChildExit exit = detail::wait_child(pid, start + deadline);
  ::killpg(pid, SIGKILL);  // anything it left behind in its group
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.timed_out = exit.timed_out;
  r.exit_code = exit.exit_code;
  r.signal = exit.signal;
  r.output = read_text(log);
  return r;
}

// `datapar train`'s result, as rank 0 printed it in its last epoch line: "epoch E/E  loss L
// train acc A  test acc T"; "" if there is none.
inline std::string train_result(const std::string& output) {
  static const std::regex line(R"(epoch (\d+)/(\d+)  loss \S+  train acc \S+  test acc \S+)");
  std::string last;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    last = it->str();
  }
  return last;
}

// One epoch of DDP on a slice of the shipped subset (a few seconds), as `datapar` trains it.
inline std::vector<std::string> small_ddp_training(const std::string& datapar, const std::string& backend) {
  return {datapar, "train", "--mode", "ddp", "--backend", backend, "--model", "mlp", "--epochs", "1",
          "--batch-size", "64", "--limit", "640", "--threads", "1", "--workers", "1"};
}

// That training as `datapar launch --nproc-per-node 2` starts it (forked workers, gloo): the
// result every other way of starting two ranks must reproduce. Its log goes into `dir`.
inline JobResult launched_training(const std::string& datapar, const std::string& dir) {
  std::vector<std::string> command = {datapar, "launch", "--nproc-per-node", "2", "--"};
  const std::vector<std::string> train = small_ddp_training(datapar, "gloo");
  command.insert(command.end(), train.begin(), train.end());
  return run_job(command, {}, dir + "/launched.log", std::chrono::seconds(120));
}

}  // namespace datapar::testing
