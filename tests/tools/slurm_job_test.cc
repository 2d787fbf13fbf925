// A job started by Slurm's srun, without `datapar launch` (issue 14), on a one-node cluster
// the test starts and stops itself: munged, slurmctld and slurmd as its children, with their
// key, configuration, state and sockets in a temporary directory and their ports free ones.
// Each rank takes its rank and world size from Slurm's variables (SLURM_PROCID,
// SLURM_NTASKS) and the store from MASTER_ADDR and MASTER_PORT (env://).
//
// Needs Debian's slurm-wlm and munge (scripts/setup.sh) and root (slurmd starts a job's
// tasks as the user who submitted it); skips, saying why, without them.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/jobs.h"
#include "testing/ports.h"
#include "testing/temp_dir.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)

namespace {

using namespace std::chrono_literals;
using datapar::testing::find_program;
using datapar::testing::JobResult;
using datapar::testing::read_text;
using datapar::testing::run_job;
using datapar::testing::TempDir;
using datapar::testing::train_result;

std::string bin(const std::string& name) { return std::string(DATAPAR_BIN_DIR) + "/" + name; }

// A TCP port free now. The daemons bind it themselves, so it cannot stay reserved
// (ReservedPort); a port taken in between fails the cluster's start, which says so.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

std::string short_hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string host = name;
  return host.substr(0, host.find('.'));
}

// Why this machine cannot run the cluster, or "".
std::string skip_reason() {
  for (const char* program : {"munged", "slurmctld", "slurmd", "srun", "sinfo"}) {
    if (find_program(program).empty()) {
      return std::string(program) + " is not installed (apt-get install slurm-wlm munge, or scripts/setup.sh)";
    }
  }
  if (::geteuid() != 0) return "slurmd must run as root (it starts each job's tasks as their user); run as root";
  return "";
}

// Every process started under the cluster's configuration: slurmstepd and the job's tasks
// carry SLURM_CONF=<ours> in their environment. The daemons themselves are children.
std::vector<pid_t> processes_with(const std::string& variable) {
  std::vector<pid_t> found;
  for (const std::string& name : datapar::detail::list_directory("/proc")) {
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string environment = read_text("/proc/" + name + "/environ");
    std::replace(environment.begin(), environment.end(), '\0', '\n');
    if (("\n" + environment).find("\n" + variable + "\n") != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// A one-node Slurm cluster; stopped, with everything started under it, when it goes out of
// scope, whether the test passed or not.
class SlurmCluster {
 public:
  SlurmCluster() : conf_(dir_.path() + "/slurm.conf") {
    const std::string& d = dir_.path();
    ::chmod(d.c_str(), 0755);  // munged wants its socket's directory searchable by all
    // A key of the cluster's own, as munge's mungekey makes one.
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      random.read(key.data(), static_cast<std::streamsize>(key.size()));
      std::ofstream(d + "/munge.key", std::ios::binary) << key;
      ::chmod((d + "/munge.key").c_str(), 0600);
    }
    const std::string socket = d + "/munge.socket";
    start("munged", {find_program("munged"), "--foreground", "--force", "--key-file=" + d + "/munge.key",
                     "--socket=" + socket, "--pid-file=" + d + "/munged.pid", "--log-file=" + d + "/munged.log",
                     "--seed-file=" + d + "/munged.seed"});
    if (!wait_for([&] { return datapar::detail::exists(socket); }, 20s)) {
      problem_ = "munged did not create its socket " + socket + " within 20 s";
      return;
    }
    const std::string host = short_hostname();
    const int controller_port = free_port(), node_port = free_port();
    std::ofstream(conf_) << "ClusterName=datapar\n"
                         << "SlurmctldHost=" << host << "(127.0.0.1)\n"
                         << "SlurmUser=root\nSlurmdUser=root\n"
                         << "SlurmctldPort=" << controller_port << "\nSlurmdPort=" << node_port << "\n"
                         << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket << "\n"
                         << "StateSaveLocation=" << d << "/state\nSlurmdSpoolDir=" << d << "/spool\n"
                         << "SlurmctldPidFile=" << d << "/slurmctld.pid\nSlurmdPidFile=" << d << "/slurmd.pid\n"
                         // No cgroups in a container: processes tracked through /proc, no task binding.
                         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                         << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
                         << "JobCompType=jobcomp/none\nSwitchType=switch/none\nMpiDefault=none\n"
                         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                         << "ReturnToService=2\nInactiveLimit=0\nMinJobAge=5\nKillWait=2\nWaittime=0\n"
                         << "NodeName=" << host << " NodeAddr=127.0.0.1 CPUs=" << cpus() << " State=UNKNOWN\n"
                         << "PartitionName=test Nodes=" << host << " Default=YES MaxTime=INFINITE State=UP\n";
    datapar::detail::make_directories(d + "/state");
    datapar::detail::make_directories(d + "/spool");
    start("slurmctld", {find_program("slurmctld"), "-D", "-vv", "-f", conf_});
    start("slurmd", {find_program("slurmd"), "-D", "-vv", "-f", conf_, "-N", host});
    std::string state;
    const bool idle = wait_for(
        [&] {
          state = run_job({find_program("sinfo"), "--noheader", "--format=%t"}, environment(),
                          dir_.path() + "/sinfo.log", 10s)
                      .output;
          return state.rfind("idle", 0) == 0;
        },
        60s);
    if (!idle) problem_ = "the node is not idle 60 s after slurmd started; sinfo says: " + state;
  }

  ~SlurmCluster() {
    stop(strays());  // the job's steps and tasks, if a test left any
    for (auto daemon = daemons_.rbegin(); daemon != daemons_.rend(); ++daemon) stop({daemon->pid}, true);
    stop(strays());
  }

  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Empty once the node is idle; else why the cluster did not start.
  const std::string& problem() const { return problem_; }

  // What a client of this cluster needs in its environment.
  std::vector<std::string> environment() const { return {variable()}; }

  // The daemons' output, for a failure's message.
  std::string logs() const {
    std::string all;
    for (const Daemon& daemon : daemons_) all += "--- " + daemon.name + ":\n" + read_text(daemon.log);
    return all;
  }

 private:
  struct Daemon {
    std::string name;
    pid_t pid;
    std::string log;
  };

  static int cpus() { return std::max(1, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))); }

  std::string variable() const { return "SLURM_CONF=" + conf_; }

  // Processes started under this cluster that are not its daemons.
  std::vector<pid_t> strays() const {
    std::vector<pid_t> found = processes_with(variable());
    for (const Daemon& daemon : daemons_) found.erase(std::remove(found.begin(), found.end(), daemon.pid), found.end());
    return found;
  }

  void start(const std::string& name, const std::vector<std::string>& argv) {
    const std::string log = dir_.path() + "/" + name + ".log";
    const pid_t pid = datapar::testing::start_in_own_group(argv, datapar::testing::environment_with(environment()), log);
    if (pid > 0) daemons_.push_back({name, pid, log});
  }

  template <typename Ready>
  static bool wait_for(Ready ready, std::chrono::seconds deadline) {
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < end) {
      if (ready()) return true;
      std::this_thread::sleep_for(200ms);
    }
    return false;
  }

  // SIGTERM, up to 5 s to end, then SIGKILL; `groups`: the process groups of children,
  // reaped here.
  static void stop(const std::vector<pid_t>& pids, bool groups = false) {
    for (pid_t pid : pids) groups ? ::killpg(pid, SIGTERM) : ::kill(pid, SIGTERM);
    const auto end = std::chrono::steady_clock::now() + 5s;
    for (pid_t pid : pids) {
      while (std::chrono::steady_clock::now() < end) {
        if (groups ? ::waitpid(pid, nullptr, WNOHANG) == pid : ::kill(pid, 0) != 0) break;
        std::this_thread::sleep_for(20ms);
      }
      groups ? ::killpg(pid, SIGKILL) : ::kill(pid, SIGKILL);
      if (groups) ::waitpid(pid, nullptr, 0);
    }
  }

  TempDir dir_{"slurm_job_test"};
  std::string conf_;
  std::vector<Daemon> daemons_;
  std::string problem_;
};

TEST(SlurmJob, SrunTrainsDdpOnGlooWithRankAndStoreFromTheEnvironment) {
  const std::string skip = skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  const TempDir dir("slurm_job_test");
  const JobResult launched = datapar::testing::launched_training(bin("datapar"), dir.path());
  ASSERT_EQ(launched.exit_code, 0) << launched.output;

  const SlurmCluster cluster;
  ASSERT_EQ(cluster.problem(), "") << cluster.logs();
  const datapar::ReservedPort port;
  std::vector<std::string> environment = cluster.environment();
  environment.insert(environment.end(), {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port.port())});
  // --overcommit: two tasks even where the node has one core; --kill-on-bad-exit: a rank
  // that fails ends the step instead of leaving the other waiting.
  std::vector<std::string> command = {find_program("srun"), "--ntasks=2", "--overcommit", "--kill-on-bad-exit=1",
                                      "--time=5"};
  const std::vector<std::string> train = datapar::testing::small_ddp_training(bin("datapar"), "gloo");
  command.insert(command.end(), train.begin(), train.end());
  const JobResult r = run_job(command, environment, dir.path() + "/srun.log", 180s);
  ASSERT_FALSE(r.timed_out) << r.output << cluster.logs();
  EXPECT_EQ(r.exit_code, 0) << "srun exits 0 only when every task did:\n" << r.output << cluster.logs();
  EXPECT_NE(r.output.find("2 ranks on gloo"), std::string::npos) << r.output;
  ASSERT_NE(train_result(r.output), "") << r.output;
  EXPECT_EQ(train_result(r.output), train_result(launched.output)) << r.output;
}

}  // namespace
