// See worker_group.h. Launcher signals reach the poll loop through a self-pipe: a handler
// may only do async-signal-safe things, and write() to a pipe is one, so the handler writes
// the signal number and poll() wakes on it.
#include "worker_group.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>

#include "child_process.h"
#include "datapar/error.h"

namespace datapar::tools {

namespace {

using detail::str_cat;

int g_signal_pipe[2] = {-1, -1};
pid_t g_launcher = -1;

void on_signal(int sig) {
  // A forked guard (which blocks every signal) or a worker before exec (start_child blocks
  // them across the fork) never runs this; should one, the signal is its own: the default.
  if (::getpid() != g_launcher) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// Note [A launcher's death reaches the whole group]
// A worker dies with the launcher (PR_SET_PDEATHSIG, even when the launcher is SIGKILLed),
// but what the worker started does not: a worker run as `sh -c '...'` left its trainer
// running, orphaned, holding its GPU and its rank's place. Each worker runs in a process
// group of its own, which everything it starts shares, so beside each worker the launcher
// forks a guard: a process that does nothing until the launcher dies (its death signal,
// SIGUSR1), then sends the worker's whole group SIGTERM, and SIGKILL after
// kOrphanGraceSeconds. A guard whose group is empty exits (checked every second), so that
// it never signals a group whose number was handed out again; the launcher ends the guards
// with the workers.
constexpr int kOrphanGraceSeconds = 5;

// In the forked guard: only async-signal-safe calls.
[[noreturn]] void guard_group(pid_t group, pid_t launcher) {
  sigset_t all, death;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);  // SIGUSR1 is taken by sigtimedwait, the launcher's stops ignored
  sigemptyset(&death);
  sigaddset(&death, SIGUSR1);
  ::prctl(PR_SET_PDEATHSIG, SIGUSR1);
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);  // holds no pipe of the launcher's open
  for (;;) {
    if (::getppid() != launcher) break;  // died before the prctl, or the signal came unseen
    const struct timespec second {1, 0};
    if (::sigtimedwait(&death, nullptr, &second) == SIGUSR1) break;
    if (::kill(-group, 0) != 0 && errno == ESRCH) ::_exit(0);  // nothing left to guard
  }
  ::kill(-group, SIGTERM);
  for (int tenth = 0; tenth < 10 * kOrphanGraceSeconds; ++tenth) {
    if (::kill(-group, 0) != 0) ::_exit(0);
    const struct timespec pause {0, 100 * 1000 * 1000};
    ::nanosleep(&pause, nullptr);
  }
  ::kill(-group, SIGKILL);
  ::_exit(0);
}

}  // namespace

void WorkerGroup::catch_signals() {
  if (g_signal_pipe[0] >= 0) return;
  g_launcher = ::getpid();
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw Error(str_cat("launch: pipe() failed: ", std::strerror(errno)));
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &action, nullptr);
  // A reader of our output that went away must not kill the launcher (and so, through
  // PDEATHSIG, every worker); writes just fail.
  ::signal(SIGPIPE, SIG_IGN);
}

WorkerGroup::WorkerGroup(const std::vector<std::string>& argv, const std::vector<WorkerSpec>& specs) : specs_(specs) {
  DATAPAR_INTERNAL_ASSERT(!argv.empty());
  const pid_t launcher = ::getpid();
  // A throw from a constructor skips the destructor: stop the workers already started.
  auto give_up = [this](const char* call, int rank, int error) {
    const std::string what = std::strerror(error);
    signal_all(SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    for (Stream& s : streams_) close_stream(s);
    return Error(str_cat("launch: ", call, " failed for rank ", rank, ": ", what));
  };
  for (const WorkerSpec& spec : specs_) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw give_up("pipe()", spec.rank, errno);
    if (::pipe2(err, O_CLOEXEC) != 0) {
      const int error = errno;
      ::close(out[0]), ::close(out[1]);
      throw give_up("pipe()", spec.rank, error);
    }
    detail::ChildOptions options;
    options.environment = spec.environment;
    options.stdout_fd = out[1];
    options.stderr_fd = err[1];
    options.cpus = spec.cpus;
    options.who = "datapar launch";
    const pid_t pid = detail::start_child(argv, options);
    if (pid < 0) {
      const int error = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
      throw give_up("fork()", spec.rank, error);
    }
    sigset_t stops, old_mask;
    sigemptyset(&stops);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, sig);
    // Note [A launcher's death reaches the whole group]. Forked with the stops blocked too.
    ::sigprocmask(SIG_BLOCK, &stops, &old_mask);
    const pid_t guard = ::fork();
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    if (guard == 0) guard_group(pid, launcher);
    if (guard > 0) guards_.push_back(guard);  // without one (fork failed), the worker still dies with us
    ::close(out[1]);
    ::close(err[1]);
    pids_.push_back(pid);
    reaped_.push_back(false);
    const std::string prefix = spec.tag_output ? str_cat("[rank ", spec.rank, "] ") : std::string();
    streams_.push_back({out[0], std::make_unique<WorkerOutput>(prefix, 1, /*live=*/::isatty(STDOUT_FILENO) == 1)});
    streams_.push_back({err[0], std::make_unique<WorkerOutput>(prefix, 2)});
  }
}

WorkerGroup::~WorkerGroup() {
  signal_all(SIGKILL);
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (!reaped_[i]) ::waitpid(pids_[i], nullptr, 0);
  }
  for (pid_t guard : guards_) {
    ::kill(guard, SIGKILL);
    ::waitpid(guard, nullptr, 0);
  }
  for (Stream& s : streams_) close_stream(s);
}

void WorkerGroup::close_stream(Stream& s) {
  if (s.fd < 0) return;
  s.output->flush();
  ::close(s.fd);
  s.fd = -1;
}

WorkerEvents WorkerGroup::poll(std::chrono::milliseconds timeout) {
  WorkerEvents events;
  std::vector<pollfd> fds;
  std::vector<Stream*> owners;
  if (g_signal_pipe[0] >= 0) fds.push_back({g_signal_pipe[0], POLLIN, 0}), owners.push_back(nullptr);
  for (Stream& s : streams_) {
    if (s.fd >= 0) fds.push_back({s.fd, POLLIN, 0}), owners.push_back(&s);
  }
  const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (ready > 0) {
    char buffer[65536];
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owners[i] == nullptr) {  // the signal pipe
        unsigned char sigs[64];
        ssize_t n;
        while ((n = ::read(fds[i].fd, sigs, sizeof(sigs))) > 0) {
          for (ssize_t k = 0; k < n; ++k) events.signals.push_back(sigs[k]);
        }
        continue;
      }
      // One read per wakeup keeps one chatty worker from starving the others.
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        owners[i]->output->add(buffer, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        close_stream(*owners[i]);  // EOF: the worker (and all it started) closed it
      }
    }
  }
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    int status = 0;
    if (::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
    reaped_[i] = true;
    WorkerExit exit{specs_[i].rank, specs_[i].local_rank, pids_[i], 0, 0};
    if (WIFEXITED(status)) exit.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
    events.exits.push_back(exit);
    if (running() == 0) all_reaped_at_ = std::chrono::steady_clock::now();
  }
  if (running() == 0 && std::chrono::steady_clock::now() - all_reaped_at_ > kDrainTimeout) {
    for (Stream& s : streams_) close_stream(s);
  }
  return events;
}

void WorkerGroup::signal_all(int sig) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    // The group outlives its leader while anything the worker started is alive.
    if (::killpg(pids_[i], sig) != 0 && !reaped_[i]) ::kill(pids_[i], sig);
  }
}

int WorkerGroup::running() const {
  int n = 0;
  for (bool r : reaped_) n += !r;
  return n;
}

bool WorkerGroup::finished() const {
  if (running() > 0) return false;
  for (const Stream& s : streams_) {
    if (s.fd >= 0) return false;
  }
  return true;
}

}  // namespace datapar::tools
