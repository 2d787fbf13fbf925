// See launch.h. One attempt = one WorkerGroup; a failure or a signal ends the attempt for
// every worker of this node, and --max-restarts decides whether another attempt follows.
//
// Multi-node: each node runs its own launcher and they do not talk to each other. A
// failure on one node reaches the others through the job itself (their workers' next
// collective fails with CommError and they exit non-zero), so every launcher sees a failure
// and, with --max-restarts, restarts its workers; the new attempt meets again at
// MASTER_ADDR:MASTER_PORT. Give every node the same --max-restarts. (Under --fault-tolerant
// they follow node 0's decider through the job's store instead: ft_nodes.h.)
#include "launch.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <set>

#include "child_process.h"
#include "datapar/error.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/ft/membership/options.h"
#include "datapar/rendezvous/tcp_store.h"
#include "file_system.h"
#include "ft_nodes.h"
#include "local_job.h"
#include "worker_group.h"

extern char** environ;

namespace datapar::tools {

namespace {

using detail::str_cat;
using Clock = std::chrono::steady_clock;

// Checks here what execvp would find, so that a typo is one clear error (exit 2) rather
// than N workers failing with 127.
void check_program(const std::string& program) {
  if (!detail::find_executable(program).empty()) return;
  DATAPAR_CHECK(program.find('/') == std::string::npos, "launch: ", program,
                " is not an executable file. Check the path after -- (relative to the current directory).");
  throw InvalidArgumentError(str_cat("launch: program \"", program,
                                     "\" is not found on PATH. Give its path, e.g. ./", program, "."));
}

// The token in `path`: its first line, without surrounding whitespace. A regular file of at
// most kMaxTokenFile bytes: a FIFO blocked open() for ever and /dev/zero read without end
// (issue 46), so the file is opened without blocking and checked before it is read.
constexpr int64_t kMaxTokenFile = 4096;
std::string read_token_file(const std::string& path) {
  const detail::RegularFile file = detail::open_regular_file(path);
  DATAPAR_CHECK(!file.irregular, "launch: --token-file ", path, " is not a regular file (a FIFO, device or ",
                "directory?). Put the token in a file, e.g. openssl rand -hex 16 > token; chmod 600 token.");
  DATAPAR_CHECK(file.fd >= 0, "launch: --token-file ", path, " cannot be read (", std::strerror(file.error), ").");
  struct stat st {};
  ::fstat(file.fd, &st);  // its mode, for the warning below
  std::string text(static_cast<size_t>(std::min<int64_t>(file.size, kMaxTokenFile)), '\0');
  const ssize_t got = ::read(file.fd, text.data(), text.size());
  ::close(file.fd);
  DATAPAR_CHECK(file.size <= kMaxTokenFile, "launch: --token-file ", path, " has ", file.size, " bytes; a token is ",
                "one short line (at most ", kMaxTokenFile, " bytes).");
  DATAPAR_CHECK(got >= 0, "launch: --token-file ", path, " cannot be read (", std::strerror(errno), ").");
  text.resize(static_cast<size_t>(got));
  std::string token = text.substr(0, text.find('\n'));
  const size_t first = token.find_first_not_of(" \t\r");
  token = first == std::string::npos ? "" : token.substr(first, token.find_last_not_of(" \t\r") - first + 1);
  DATAPAR_CHECK(!token.empty(), "launch: --token-file ", path, " is empty. Put the token on its first line, e.g. ",
                "openssl rand -hex 16 > ", path);
  if ((st.st_mode & 077) != 0) {
    std::cerr << "datapar launch: warning: --token-file " << path << " can be read by other users; chmod 600 it"
              << std::endl;
  }
  return token;
}

std::string describe(const WorkerExit& e) {
  if (e.signal == 0) return str_cat("exited with code ", e.exit_code);
  return str_cat("was killed by signal ", e.signal, " (", ::strsignal(e.signal), ")");
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return str_cat("signal ", sig);
  }
}

std::string workers(int n) { return str_cat(n, n == 1 ? " worker" : " workers"); }

void say(const LaunchOptions& options, const std::string& line) { std::cerr << options.who << ": " << line << std::endl; }

struct AttemptResult {
  std::optional<WorkerExit> failure;  // the first worker to fail
  int stopped = 0;                    // workers still running when it failed
  int signal = 0;                     // a signal the launcher got (then no restart)
};

// Note [Binding workers to cores]
// Workers of one machine meet in shared memory many times per step, and a waiting worker
// polls for microseconds before it yields its core. Left to the scheduler, two workers
// sometimes share one core while another idles (measured: a 4 KiB all_reduce over 2
// workers took 11-16 us in some runs and 60-350 us in others, the same binary); each then
// waits for the other's time slice at every meeting point. Bound to their own cores, as
// mpirun binds its ranks, every run took 11-16 us. So forked workers get the launcher's
// cores in consecutive shares (--cpu-bind cores, the default); with fewer cores than
// workers nothing is bound. A worker's intra-op threads stay within its share, which is
// what OMP_NUM_THREADS=1 (set by default for several workers) assumes anyway.
std::vector<std::vector<int>> split_cores(int n) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  const size_t m = cpus.size();
  if (n < 2 || m < static_cast<size_t>(n)) return {};
  std::vector<std::vector<int>> shares(static_cast<size_t>(n));
  for (size_t w = 0; w < shares.size(); ++w) {
    shares[w].assign(cpus.begin() + static_cast<long>(w * m / shares.size()),
                     cpus.begin() + static_cast<long>((w + 1) * m / shares.size()));
  }
  return shares;
}

// The cores of each worker (empty: unbound).
std::vector<std::vector<int>> worker_cores(const LaunchOptions& options) {
  return options.cpu_bind == "cores" ? split_cores(options.nproc_per_node) : std::vector<std::vector<int>>{};
}

// Worker `local_rank`, in its `restart_count`-th start.
WorkerSpec worker_spec(const LaunchOptions& options, const std::vector<std::vector<int>>& cores, int local_rank,
                       int restart_count) {
  return {options.node_rank * options.nproc_per_node + local_rank, local_rank,
          worker_environment(options, local_rank, restart_count),
          cores.empty() ? std::vector<int>{} : cores[static_cast<size_t>(local_rank)], options.tag_output};
}

std::unique_ptr<WorkerGroup> start_workers(const LaunchOptions& options, int restart_count) {
  const std::vector<std::vector<int>> cores = worker_cores(options);
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    specs.push_back(worker_spec(options, cores, local_rank, restart_count));
  }
  return std::make_unique<WorkerGroup>(options.program, specs);
}

// Runs one attempt to its end: every worker reaped and its output flushed.
AttemptResult run_attempt(const LaunchOptions& options, int restart_count) {
  const std::unique_ptr<WorkerGroup> started = start_workers(options, restart_count);
  WorkerGroup& group = *started;
  AttemptResult result;
  std::optional<Clock::time_point> kill_at;  // set once stopping has begun
  int stop_signal = SIGTERM;  // what the workers were asked to stop with
  bool killed = false;
  while (!group.finished()) {
    const WorkerEvents events = group.poll(std::chrono::milliseconds(100));
    for (int sig : events.signals) {
      // A second signal (an impatient Ctrl-C) skips the grace period.
      if (result.signal != 0 && !killed) {
        group.signal_all(SIGKILL);
        killed = true;
        continue;
      }
      result.signal = sig;
      say(options, str_cat("got ", signal_name(sig), "; forwarding it to ", workers(group.running())));
      group.signal_all(sig);
      if (!kill_at) kill_at = Clock::now() + options.grace_period, stop_signal = sig;
    }
    for (const WorkerExit& e : events.exits) {
      if (!e.failed() || result.failure || result.signal != 0) continue;
      result.failure = e;
      result.stopped = group.running();
      if (result.stopped > 0) group.signal_all(SIGTERM);
      if (!kill_at) kill_at = Clock::now() + options.grace_period, stop_signal = SIGTERM;
    }
    if (kill_at && !killed && Clock::now() >= *kill_at && group.running() > 0) {
      say(options, str_cat(workers(group.running()), " still running ", options.grace_period.count(),
                  " ms after ", signal_name(stop_signal),
                  "; killing them (SIGKILL)"));
      group.signal_all(SIGKILL);
      killed = true;
    }
  }
  return result;
}

// Note [A fault-tolerant job's launcher]
// Under --fault-tolerant each worker is a group of its own (WorkerGroup), so that one can
// end and start again while the others run on. Node 0's launcher serves the job's store and
// runs the membership decider (datapar/ft/membership/decider.h): no worker hosts anything, so any may
// die. A failed worker is restarted alone, as a new member that joins the running job and
// takes its state from a peer; one out of restarts is given up on, and the others go on as
// long as the decider lets the job go on (at least --min-ranks). When the decider stops the
// job, the launcher stops every worker.
// A worker that exits with a failure is reported dead to the decider at once (ft_nodes.h),
// so that the others go on without waiting --ft-timeout for its heartbeat to stop.
// On several nodes (ft_nodes.h) the other launchers restart their own workers alike and
// read the decider's verdict from the store; node 0 serves the store until each of them is
// done or gone (silent for --ft-timeout). Node 0's launcher is the one whose loss ends the
// job: the others, finding the store gone, stop their workers and restart none.
// How long a launcher waits for the store to answer before it restarts a worker.
constexpr std::chrono::seconds kStoreAnswer{3};

// What this launcher tells its workers (their JobConfig::fault_tolerance), and its decider
// derives its options from alike (ft::launched_job_options).
FaultToleranceConfig fault_tolerance_of(const LaunchOptions& o) {
  const int world = o.nnodes * o.nproc_per_node;
  return {o.ft_timeout, o.min_ranks, o.max_ranks > 0 ? o.max_ranks : world, o.node_rank};
}

// One node's launcher of a fault-tolerant job (Note above): its workers, each a group of its
// own, and what it knows of the job.
class FaultTolerantLauncher {
 public:
  explicit FaultTolerantLauncher(const LaunchOptions& options)
      : options_(options), ft_options_(ft::launched_job_options(fault_tolerance_of(options),
                                                                options.nnodes * options.nproc_per_node)),
        cores_(worker_cores(options)) {
    const auto port = static_cast<uint16_t>(options.master_port);
    // The workers' run id (JobConfig::run_id): the one given, else the token.
    const std::string run_id = options.run_id.empty() ? options.token : options.run_id;
    const TcpStoreOptions client{options.master_addr, port, false, options.token, kDefaultTimeout, run_id};
    if (options.node_rank == 0) {
      TcpStoreOptions server = client;
      server.is_server = true;
      store_ = std::make_shared<TcpStore>(server);
      ft::FtOptions deciding = ft_options_;
      deciding.replica_group_size = 0;  // as the workers say (--mode hsdp: their shard groups)
      decider_ = std::make_unique<ft::Decider>(std::make_shared<TcpStore>(client), ft::kLaunchedRun, deciding);
    }
    nodes_ = std::make_unique<FtNodes>(client, ft::kLaunchedRun, options.node_rank, options.nnodes,
                                       ft_options_.heartbeat_interval, ft_options_.eviction_timeout,
                                       ft_options_.quorum_timeout);
    slots_.resize(static_cast<size_t>(options.nproc_per_node));
    for (int i = 0; i < options.nproc_per_node; ++i) slots_[static_cast<size_t>(i)].group = start_worker(i, 0);
  }

  // Supervises the workers until none runs (nor, on node 0, any other node's); the exit code.
  int run() {
    const auto poll_each = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(100) / slots_.size(),
                                                               std::chrono::milliseconds(5));
    while (running()) {
      for (size_t i = 0; i < slots_.size(); ++i) {
        const WorkerEvents events = slots_[i].group->poll(poll_each);
        for (int sig : events.signals) forward(sig);
        for (const WorkerExit& e : events.exits) worker_exited(slots_[i], e);
        restart_if_due(i);
      }
      check_job();
      if (kill_at_ && !killed_ && Clock::now() >= *kill_at_) {
        signal_all(SIGKILL);
        killed_ = true;
      }
    }
    if (options_.node_rank != 0) nodes_->report_done(completed_ || complete_);
    return exit_code();
  }

 private:
  struct Slot {
    std::unique_ptr<WorkerGroup> group;
    int restarts = 0;
    bool restart = false;                // start it again once its group has finished
    std::optional<WorkerExit> given_up;  // failed with no restart left
  };

  std::unique_ptr<WorkerGroup> start_worker(int local_rank, int restarts) const {
    return std::make_unique<WorkerGroup>(options_.program,
                                         std::vector<WorkerSpec>{worker_spec(options_, cores_, local_rank, restarts)});
  }

  void signal_all(int sig) {
    for (Slot& slot : slots_) slot.group->signal_all(sig);
  }

  void stop_all() {
    signal_all(SIGTERM);
    if (!kill_at_) kill_at_ = Clock::now() + options_.grace_period;
  }

  // Node 0 with other nodes: serves the store until they are done (Note above).
  bool others_running() const {
    return options_.node_rank == 0 && launcher_signal_ == 0 && nodes_->others_ended() < options_.nnodes - 1;
  }

  bool running() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.group->finished() || s.restart; }) ||
           others_running();
  }

  bool stopping() const { return launcher_signal_ != 0 || !stop_reason_.empty() || !store_error_.empty(); }

  // A signal to the launcher goes to every worker; a second one skips the grace period.
  void forward(int sig) {
    if (launcher_signal_ != 0 && !killed_) {
      signal_all(SIGKILL);
      killed_ = true;
      return;
    }
    launcher_signal_ = sig;
    say(options_, str_cat("got ", signal_name(sig), "; forwarding it to every worker"));
    signal_all(sig);
    if (!kill_at_) kill_at_ = Clock::now() + options_.grace_period;
  }

  // Reads the decider's verdict (node 0) or the store's (the others), and whether the store
  // still answers; stops every worker when the job stops.
  void check_job() {
    if (options_.node_rank != 0 && store_error_.empty() && !(store_error_ = nodes_->store_error()).empty()) {
      // Node 0 serves the store until this node is done, so it is gone (or cut off): without
      // the decider no membership can form, and a worker could only wait for it.
      say(options_, str_cat("the job's store at ", options_.master_addr, ":", options_.master_port,
                            " cannot be reached (", store_error_, "): node 0's launcher is gone or the network "
                            "failed, and the job cannot go on without it; stopping every worker"));
      stop_all();
    }
    if (!stop_reason_.empty()) return;
    stop_reason_ = decider_ ? decider_->stop_reason() : nodes_->stop_reason();
    if (stop_reason_.empty()) return;
    complete_ = decider_ ? decider_->training_complete() : nodes_->training_complete();
    if (complete_) {  // its workers end by themselves, with nothing to do
      if (!completed_) say(options_, str_cat("the training is complete: ", stop_reason_));
      return;
    }
    if (!completed_) say(options_, str_cat("the job stops: ", stop_reason_, "; stopping every worker"));
    stop_all();
  }

  // A worker of `slot` ended: a failed one is reported dead at once, and restarted alone
  // while it has restarts left and the job goes on.
  void worker_exited(Slot& slot, const WorkerExit& e) {
    completed_ |= !e.failed();
    if (e.failed()) {
      nodes_->worker_failed(e.pid);  // the others need not wait for its heartbeat to stop
      // It may have failed because node 0 is gone: then nothing is restarted.
      if (options_.node_rank != 0) nodes_->store_answers(kStoreAnswer);
    }
    check_job();  // a worker that exits because the job stops is not restarted
    if (!e.failed() || stopping()) return;
    const std::string who = str_cat("rank ", e.rank, " (local rank ", e.local_rank, ", pid ", e.pid, ") ", describe(e));
    if (slot.restarts < options_.max_restarts) {
      slot.restart = true;
      say(options_, str_cat(who, "; restarting it alone (restart ", slot.restarts + 1, " of ", options_.max_restarts,
                            "); the other workers go on"));
    } else {
      slot.given_up = e;
      say(options_, str_cat(who, options_.max_restarts > 0 ? "; out of restarts" : "",
                            "; the other workers go on without it"));
    }
  }

  // Starts slot i's worker again once its output is read to the end.
  void restart_if_due(size_t i) {
    Slot& slot = slots_[i];
    if (!slot.restart || !slot.group->finished()) return;
    slot.restart = false;
    if (stopping()) return;
    ++slot.restarts;
    slot.group = start_worker(static_cast<int>(i), slot.restarts);
  }

  int exit_code() const {
    if (launcher_signal_ != 0) return 128 + launcher_signal_;
    // Done when a worker finished the training (a worker given up on is reported above; one
    // that came too late to join is stopped with the decider's verdict, which is moot then).
    if (completed_ || complete_) return 0;
    if (!stop_reason_.empty() || !store_error_.empty()) return 1;
    for (const Slot& slot : slots_) {
      if (slot.given_up) return slot.given_up->signal != 0 ? 128 + slot.given_up->signal : slot.given_up->exit_code;
    }
    return 1;
  }

  const LaunchOptions& options_;
  const ft::FtOptions ft_options_;
  const std::vector<std::vector<int>> cores_;
  std::shared_ptr<TcpStore> store_;       // node 0 serves the job's store
  std::unique_ptr<ft::Decider> decider_;  // and decides its membership
  std::unique_ptr<FtNodes> nodes_;
  std::vector<Slot> slots_;
  int launcher_signal_ = 0;
  std::string stop_reason_, store_error_;
  std::optional<Clock::time_point> kill_at_;
  bool killed_ = false;
  bool completed_ = false;  // a worker finished the training
  bool complete_ = false;   // the decider's verdict: the training is complete (a late worker has nothing to do)
};

int launch_fault_tolerant(const LaunchOptions& options) { return FaultTolerantLauncher(options).run(); }

}  // namespace

LaunchOptions resolve_launch_options(LaunchOptions o) {
  DATAPAR_CHECK(!o.program.empty(), "launch: no program to run. Put it after --, e.g. ",
                "datapar launch --nproc-per-node 2 -- ./train --epochs 3");
  DATAPAR_CHECK(o.nproc_per_node >= 1, "launch: --nproc-per-node must be at least 1, not ", o.nproc_per_node, ".");
  DATAPAR_CHECK(o.nproc_per_node <= kMaxProcesses, "launch: --nproc-per-node ", o.nproc_per_node, " is more than ",
                kMaxProcesses, " workers on one node; use 1 .. ", kMaxProcesses, ".");
  DATAPAR_CHECK(o.nnodes >= 1, "launch: --nnodes must be at least 1, not ", o.nnodes, ".");
  DATAPAR_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank ", o.node_rank,
                " is outside [0, ", o.nnodes, "). Number the nodes 0 .. ", o.nnodes - 1, " (0 hosts the store).");
  DATAPAR_CHECK(o.master_port >= 0 && o.master_port <= 65535, "launch: --master-port ", o.master_port,
                " is not a TCP port (0 .. 65535).");
  DATAPAR_CHECK(o.max_restarts >= 0, "launch: --max-restarts must be 0 or more, not ", o.max_restarts, ".");
  if (o.fault_tolerant) {
    const int world = o.nnodes * o.nproc_per_node;
    DATAPAR_CHECK(o.min_ranks >= 1 && o.min_ranks <= world, "launch: --min-ranks ", o.min_ranks,
                  " must be in [1, ", world, "] (the workers of the job).");
    DATAPAR_CHECK(o.max_ranks == 0 || (o.max_ranks >= o.min_ranks), "launch: --max-ranks ", o.max_ranks,
                  " is below --min-ranks ", o.min_ranks, ".");
    DATAPAR_CHECK(o.ft_timeout.count() >= 100, "launch: --ft-timeout must be at least 0.1 s (a worker silent that "
                  "long is evicted; heartbeats come ten times as often).");
  } else {
    DATAPAR_CHECK(o.min_ranks == 1 && o.max_ranks == 0, "launch: --min-ranks and --max-ranks are for a ",
                  "fault-tolerant job; add --fault-tolerant.");
  }
  DATAPAR_CHECK(o.grace_period.count() >= 0, "launch: --grace-period must not be negative.");
  DATAPAR_CHECK(!o.master_addr.empty(), "launch: --master-addr is empty.");
  check_program(o.program.front());
  DATAPAR_CHECK(o.token.empty() || o.token_file.empty(), "launch: give --token or --token-file, not both.");
  if (!o.token_file.empty()) o.token = read_token_file(o.token_file);
  if (o.token.empty()) {
    if (const char* env = std::getenv("DATAPAR_STORE_TOKEN")) o.token = env;
  }
  DATAPAR_CHECK(o.token.size() <= 256, "launch: the store token has ", o.token.size(),
                " bytes; it may have at most 256 (openssl rand -hex 16 gives 32).");
  if (o.nnodes > 1) {
    DATAPAR_CHECK(o.master_port != 0, "launch: --nnodes ", o.nnodes, " needs --master-port: every node must ",
                  "know the port of node 0's store in advance, e.g. --master-port 29500.");
    DATAPAR_CHECK(!o.token.empty(), "launch: --nnodes ", o.nnodes, " needs the same store token on every node. ",
                  "Give each launcher --token-file FILE (or DATAPAR_STORE_TOKEN in its environment), e.g. a file ",
                  "made with openssl rand -hex 16 > FILE and copied to every node.");
  }
  if (o.token.empty()) o.token = make_store_token();
  if (o.run_id.empty()) {
    if (const char* env = std::getenv("DATAPAR_RUN_ID")) o.run_id = env;
  }
  // One node: a run id of its own, so that another job given the same port and token is
  // refused by this one's store. Several: the launchers cannot agree on a random one.
  if (o.run_id.empty() && o.nnodes == 1) o.run_id = make_store_token();
  if (o.master_port == 0) {  // single node: a free port of the master address, held for the job
    o.master_port_reservation = std::make_shared<const ReservedPort>(o.master_addr);
    o.master_port = o.master_port_reservation->port();
  }
  return o;
}

std::vector<std::string> worker_environment(const LaunchOptions& o, int local_rank, int restart_count) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"DATAPAR_STORE_TOKEN", o.token},
      {"DATAPAR_RUN_ID", o.run_id},
      {"DATAPAR_RESTART_COUNT", std::to_string(restart_count)},
      {"DATAPAR_MAX_RESTARTS", std::to_string(o.max_restarts)},
  };
  if (o.fault_tolerant) {  // JobConfig::fault_tolerance
    const FaultToleranceConfig ft = fault_tolerance_of(o);
    ours.push_back({"DATAPAR_FAULT_TOLERANT", "1"});
    ours.push_back({"DATAPAR_FT_TIMEOUT_MS", std::to_string(ft.timeout.count())});
    ours.push_back({"DATAPAR_FT_MIN_RANKS", std::to_string(ft.min_ranks)});
    ours.push_back({"DATAPAR_FT_MAX_RANKS", std::to_string(ft.max_ranks)});
  }
  // The launcher's stdout is a terminal: rank 0 may draw its live progress line, which the
  // launcher passes through unprefixed (worker_output.h). Piped or to a file: plain lines.
  if (::isatty(STDOUT_FILENO) == 1) ours.push_back({"DATAPAR_LIVE_OUTPUT", "1"});
  if (o.run_id.empty()) {  // none given across nodes: the workers' own, else the token (JobConfig::run_id)
    ours.erase(std::find_if(ours.begin(), ours.end(), [](const auto& v) { return v.first == "DATAPAR_RUN_ID"; }));
  }
  std::set<std::string> names;
  for (const auto& [name, value] : ours) names.insert(name);
  std::vector<std::string> env;
  bool omp_set = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (names.count(name)) continue;
    omp_set |= name == "OMP_NUM_THREADS";
    env.push_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  if (!omp_set && o.nproc_per_node > 1) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

int launch(const LaunchOptions& given) {
  if (given.token_on_command_line) {
    say(given, "warning: --token is visible to every user of this machine (ps, /proc/PID/cmdline); "
        "prefer --token-file FILE or DATAPAR_STORE_TOKEN in the environment");
  }
  LaunchOptions options = resolve_launch_options(given);
  WorkerGroup::catch_signals();
  if (options.fault_tolerant) return launch_fault_tolerant(options);
  for (int restart = 0;; ++restart) {
    const AttemptResult r = run_attempt(options, restart);
    if (r.signal != 0) return 128 + r.signal;
    if (!r.failure) return 0;
    const WorkerExit& f = *r.failure;
    say(options, str_cat("rank ", f.rank, " (local rank ", f.local_rank, ", pid ", f.pid, ") ", describe(f), "; ",
                r.stopped > 0 ? str_cat("stopped the other ", workers(r.stopped)) : "no other worker was running",
                options.nnodes > 1 ? " on this node" : ""));
    if (restart >= options.max_restarts) {
      if (options.max_restarts > 0) say(options, str_cat("giving up after ", options.max_restarts, " restarts"));
      return f.signal != 0 ? 128 + f.signal : f.exit_code;
    }
    say(options, str_cat("restarting all ", workers(options.nproc_per_node), " (restart ", restart + 1, " of ",
                options.max_restarts, ")"));
  }
}

}  // namespace datapar::tools
