// See mpirun_group.h. The two halves of one protocol live here: MpirunGroup in the
// launcher, run_mpirun_rank() in each `datapar launch-rank` process under mpirun.
#include "mpirun_group.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "datapar/error.h"
#include "stale_files.h"

extern char** environ;

namespace datapar::tools {

namespace {

using detail::str_cat;
using Clock = std::chrono::steady_clock;

// mpirun still running this long after every rank reported its end is stuck: kill it.
constexpr auto kMpirunExitTimeout = std::chrono::seconds(5);

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `text` to `path` so that a reader sees all of it or no file.
bool write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << text;
    if (!out.flush()) return false;
  }
  return std::rename(temporary.c_str(), path.c_str()) == 0;
}

std::string self_executable() {
  char self[4096] = {};
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  DATAPAR_CHECK(length > 0, "launch: cannot find this program's path (/proc/self/exe) to start launch-rank.");
  return self;
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  DATAPAR_CHECK(value != nullptr, "launch-rank: ", name, " is not set: launch-rank runs under mpirun, started by ",
                "datapar launch. Run datapar launch --nproc-per-node N -- PROGRAM instead.");
  return std::atoi(value);
}

pid_t g_program = -1;  // the rank's PROGRAM, for the signal handler

void forward_to_program(int sig) {
  if (g_program > 0 && ::killpg(g_program, sig) != 0) ::kill(g_program, sig);
}

}  // namespace

std::string find_mpirun() {
  const std::string built = DATAPAR_MPIEXEC;  // found at build time
  if (!built.empty() && !find_executable(built).empty()) return built;
  return find_executable("mpirun");
}

void allow_mpirun_as_asked() {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", /*overwrite=*/0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
}

MpirunGroup::MpirunGroup(const std::string& mpirun, const std::vector<std::string>& argv, int nproc,
                         const std::vector<std::string>& environment)
    : ranks_(nproc) {
  // Named after our pid, so that the next launcher removes them if we are SIGKILLed
  // (stale_files.h); Open MPI's own segments go into shm_dir_ instead of /dev/shm's top.
  const char* tmp = std::getenv("TMPDIR");
  const std::string tmp_dir = tmp && *tmp ? tmp : "/tmp";
  detail::remove_stale_entries(tmp_dir, "datapar-launch-");
  detail::remove_stale_entries("/dev/shm", "datapar-launch-");
  const std::string name = str_cat("datapar-launch-", ::getpid(), "-XXXXXX");
  std::string pattern = str_cat(tmp_dir, "/", name);
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(str_cat("launch: cannot make a directory like ", pattern, ": ", std::strerror(errno),
                        ". Set TMPDIR to a writable directory."));
  }
  dir_ = pattern;
  std::string shm_pattern = "/dev/shm/" + name;
  if (!std::getenv("OMPI_MCA_btl_vader_backing_directory") && ::mkdtemp(shm_pattern.data()) != nullptr) {
    shm_dir_ = shm_pattern;
  }
  std::vector<std::pair<int, std::string>> outputs;  // read ends, opened before mpirun starts
  auto clean_up = [&] {
    for (auto& [fd, label] : outputs) ::close(fd);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    if (!shm_dir_.empty()) std::filesystem::remove_all(shm_dir_, ignored);
  };
  auto give_up = [&](const std::string& what) {
    const Error error(str_cat("launch: ", what, ": ", std::strerror(errno)));
    clean_up();
    return error;
  };
  for (int rank = 0; rank < nproc; ++rank) {
    for (const char* stream : {".out", ".err"}) {
      const std::string fifo = path(rank, stream);
      if (::mkfifo(fifo.c_str(), 0600) != 0) throw give_up("mkfifo " + fifo);
      // Non-blocking: opens now, with no writer yet; poll() reports nothing until one comes.
      const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) throw give_up("open " + fifo);
      outputs.emplace_back(fd, str_cat("rank ", rank));
    }
  }
  std::vector<std::string> command = {mpirun, "-n", std::to_string(nproc), "--bind-to", "none", self_executable(),
                                      "launch-rank", dir_, "--"};
  command.insert(command.end(), argv.begin(), argv.end());
  std::vector<std::string> mpirun_environment = environment;
  if (!shm_dir_.empty()) mpirun_environment.push_back("OMPI_MCA_btl_vader_backing_directory=" + shm_dir_);
  try {
    mpirun_ = std::make_unique<WorkerGroup>(command, std::vector<WorkerSpec>{{0, 0, mpirun_environment, "mpirun"}});
  } catch (const Error&) {
    clean_up();
    throw;
  }
  for (size_t i = 0; i < outputs.size(); ++i) mpirun_->carry_output(outputs[i].first, outputs[i].second, i % 2 ? 2 : 1);
}

MpirunGroup::~MpirunGroup() {
  for (const Rank& r : ranks_) {
    if (!r.ended && r.pid > 0) ::killpg(r.pid, SIGKILL);
  }
  mpirun_.reset();  // SIGKILLs and reaps mpirun; launch-rank and PROGRAM die with it
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
  if (!shm_dir_.empty()) std::filesystem::remove_all(shm_dir_, ignored);
}

std::string MpirunGroup::path(int rank, const char* suffix) const { return str_cat(dir_, "/", rank, suffix); }

WorkerEvents MpirunGroup::poll(std::chrono::milliseconds timeout) {
  WorkerEvents events = mpirun_->poll(timeout);
  for (const WorkerExit& e : events.exits) {  // mpirun's own: not a worker
    mpirun_ended_ = true;
    mpirun_status_ = e.signal != 0 ? 128 + e.signal : e.exit_code;
  }
  events.exits.clear();
  for (int rank = 0; rank < static_cast<int>(ranks_.size()); ++rank) {
    Rank& r = ranks_[rank];
    if (r.ended) continue;
    if (r.pid < 0) {
      if (auto text = read_small_file(path(rank, ".pid"))) r.pid = std::atoi(text->c_str());
    }
    WorkerExit exit{rank, rank, r.pid, 0, 0, ""};
    if (auto text = read_small_file(path(rank, ".exit"))) {
      std::istringstream(*text) >> exit.exit_code >> exit.signal;
    } else if (mpirun_ended_) {  // launch-rank never reported: mpirun ended it, or never started it
      exit.exit_code = mpirun_status_ != 0 ? mpirun_status_ : 1;
      exit.how = str_cat(r.pid > 0 ? "ended without a report" : "was never started", ": mpirun exited with ",
                         mpirun_status_ > 128 ? str_cat("signal ", mpirun_status_ - 128) : str_cat("code ", mpirun_status_),
                         " (its output, prefixed [mpirun], says why)");
    } else {
      continue;
    }
    r.ended = true;
    events.exits.push_back(exit);
    if (running() == 0) all_ended_at_ = Clock::now();
  }
  if (running() == 0 && !mpirun_ended_ && Clock::now() - all_ended_at_ > kMpirunExitTimeout) {
    mpirun_->signal_all(SIGKILL);
  }
  return events;
}

void MpirunGroup::signal_all(int sig) {
  bool unstarted = false;
  for (const Rank& r : ranks_) {
    if (r.ended) continue;
    if (r.pid > 0) {
      if (::killpg(r.pid, sig) != 0) ::kill(r.pid, sig);
    } else {
      unstarted = true;
    }
  }
  // Ranks not started yet can only be stopped through mpirun; SIGKILL ends everything.
  if (unstarted || sig == SIGKILL) mpirun_->signal_all(sig);
}

int MpirunGroup::running() const {
  int n = 0;
  for (const Rank& r : ranks_) n += !r.ended;
  return n;
}

bool MpirunGroup::finished() const { return running() == 0 && mpirun_->finished(); }

int run_mpirun_rank(const std::string& dir, const std::vector<std::string>& program) {
  DATAPAR_CHECK(!program.empty(), "launch-rank: no program after --.");
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with mpirun, and PROGRAM with us
  const pid_t mpirun = ::getppid();
  const int rank = env_int("OMPI_COMM_WORLD_RANK");
  const std::vector<std::pair<const char*, std::string>> torchrun = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(env_int("OMPI_COMM_WORLD_LOCAL_RANK"))},
      {"WORLD_SIZE", std::to_string(env_int("OMPI_COMM_WORLD_SIZE"))},
      {"LOCAL_WORLD_SIZE", std::to_string(env_int("OMPI_COMM_WORLD_LOCAL_SIZE"))},
      {"GROUP_RANK", "0"},
  };
  for (const auto& [name, value] : torchrun) ::setenv(name, value.c_str(), 1);
  const std::string base = str_cat(dir, "/", rank);
  const int out = ::open((base + ".out").c_str(), O_WRONLY | O_CLOEXEC);
  const int err = ::open((base + ".err").c_str(), O_WRONLY | O_CLOEXEC);
  DATAPAR_CHECK(out >= 0 && err >= 0, "launch-rank: cannot open ", base, ".out / .err: ", std::strerror(errno),
                ". launch-rank runs under mpirun, started by datapar launch.");
  if (::getppid() != mpirun) return 1;  // mpirun died before PDEATHSIG was armed

  std::vector<char*> argv;
  for (const std::string& a : program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  sigset_t stops, old_mask;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, sig);
  ::sigprocmask(SIG_BLOCK, &stops, &old_mask);  // until the handler knows PROGRAM's pid
  const pid_t self = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) exec_worker(self, out, err, argv.data(), environ);
  ::close(out);
  ::close(err);
  DATAPAR_CHECK(pid > 0, "launch-rank: fork() failed: ", std::strerror(errno));
  ::setpgid(pid, pid);  // as the child does: no race with a signal forwarded to its group
  g_program = pid;
  struct sigaction action {};
  action.sa_handler = forward_to_program;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &action, nullptr);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  bool reported = write_file_atomically(base + ".pid", str_cat(pid, "\n"));

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  const int signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  reported &= write_file_atomically(base + ".exit", str_cat(code, " ", signal, "\n"));
  return reported ? 0 : 1;
}

}  // namespace datapar::tools
