// See child_process.h.
#include "child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace datapar::detail {
namespace {

bool is_executable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void say(const char* text) {
  [[maybe_unused]] const ssize_t n = ::write(2, text, std::strlen(text));
}

}  // namespace

std::string find_executable(const std::string& program, const std::vector<std::string>& also_in) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return is_executable(program) ? program : "";
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs;
  const std::string list = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(':', start);
    if (end == std::string::npos) end = list.size();
    dirs.push_back(end > start ? list.substr(start, end - start) : ".");  // an empty entry is the current directory
    start = end + 1;
  }
  dirs.insert(dirs.end(), also_in.begin(), also_in.end());
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/" + program;
    if (is_executable(candidate)) return candidate;
  }
  return "";
}

std::string this_program() {
  char path[4096] = {};
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  return length > 0 ? std::string(path, static_cast<size_t>(length)) : std::string();
}

pid_t start_child(const std::vector<std::string>& argv, const ChildOptions& options) {
  if (argv.empty()) {
    errno = EINVAL;
    return -1;
  }
  // Everything the child needs, made before the fork.
  const std::string path = find_executable(argv[0]);
  const std::string not_found = options.who + ": cannot run " + argv[0] + ": not an executable file" +
                                (argv[0].find('/') == std::string::npos ? " on PATH" : "") + "\n";
  const std::string failed = options.who + ": cannot run " + argv[0] + ": ";
  std::vector<char*> args = c_strings(argv);
  std::vector<char*> envp;
  if (options.environment) envp = c_strings(*options.environment);
  char* const* env = options.environment ? envp.data() : environ;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : options.cpus) CPU_SET(cpu, &cpus);
  const pid_t parent = ::getpid();
  // No handler of this process may run in the child between fork and exec: block every
  // signal across the fork; the child unblocks them once their defaults are back.
  sigset_t all, old_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = ::fork();
  if (pid != 0) {
    const int error = errno;
    ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    if (pid > 0 && options.own_process_group) ::setpgid(pid, pid);  // exists before anyone signals it
    errno = error;
    return pid;
  }
  // The child: async-signal-safe calls only.
  // Ignored signals stay ignored across exec (a shell's `&` ignores SIGINT): give the
  // program the defaults, so that the signals it is sent act.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGCHLD}) ::signal(sig, SIG_DFL);
  if (options.own_process_group) ::setpgid(0, 0);
  if (options.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the parent died before the prctl: no signal will come
  }
  if (!options.cpus.empty()) ::sched_setaffinity(0, sizeof(cpu_set_t), &cpus);  // best effort
  const int in_fd = options.stdin_fd >= 0 ? options.stdin_fd : ::open("/dev/null", O_RDONLY);
  if (in_fd >= 0) ::dup2(in_fd, 0);
  if (options.stdout_fd >= 0) ::dup2(options.stdout_fd, 1);
  if (options.stderr_fd >= 0) ::dup2(options.stderr_fd, 2);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (path.empty()) {
    say(not_found.c_str());
    ::_exit(127);
  }
  ::execve(path.c_str(), args.data(), env);
  say(failed.c_str());
  say(std::strerror(errno));  // glibc's strerror reads a static table for a known errno
  say("\n");
  ::_exit(127);
}

ChildExit wait_child(pid_t pid, std::optional<std::chrono::steady_clock::time_point> deadline) {
  ChildExit out;
  int status = 0;
  struct rusage usage {};
  auto reap = [&](int flags) {
    pid_t done;
    while ((done = ::wait4(pid, &status, flags, &usage)) < 0 && errno == EINTR) {
    }
    return done;
  };
  if (!deadline) {
    reap(0);
  } else {
    for (;;) {
      const pid_t done = reap(WNOHANG);
      if (done != 0) break;  // reaped, or an error (no such child)
      if (std::chrono::steady_clock::now() >= *deadline) {
        out.timed_out = true;
        if (::getpgid(pid) == pid) ::killpg(pid, SIGKILL);
        ::kill(pid, SIGKILL);
        reap(0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (WIFEXITED(status)) out.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  out.peak_resident_bytes = int64_t{usage.ru_maxrss} * 1024;  // ru_maxrss is in KiB
  return out;
}

pid_t fork_child(const std::function<int()>& body, const std::string& who) {
  std::fflush(nullptr);  // else the child, flushing at its exit, writes the parent's pending output again
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 1;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: an exception that is not a std::exception\n", who.c_str());
  }
  std::fflush(nullptr);
  std::_Exit(code);
}

std::vector<ChildExit> fork_ranks(int n, const std::function<int(int)>& rank_main, const std::string& who) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    // -1 when fork failed: wait_child reports it as not exited
    pids.push_back(fork_child([&] { return rank_main(rank); }, who + ": rank " + std::to_string(rank)));
  }
  std::vector<ChildExit> exits;
  for (pid_t pid : pids) exits.push_back(pid > 0 ? wait_child(pid) : ChildExit{});
  return exits;
}

}  // namespace datapar::detail
