// `datapar launch` with real processes: the CLI runs tests/testing/launch_probe as its
// workers. Every wait has a deadline, so a launcher that hangs fails the test instead.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/version.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "datapar/config.h"
#include "datapar/ft/membership/membership.h"
#include "datapar/rendezvous/prefix_store.h"
#include "datapar/rendezvous/reserved_port.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/state_dict.h"
#include "datapar/train/checkpoint.h"
#include "datapar/train/metrics.h"
#include "datapar/train/plot.h"
#include "testing/namespaces.h"
#include "testing/processes.h"
#include "testing/temp_dir.h"
#include "testing/text.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)

namespace {

using datapar::testing::count;
using datapar::testing::read_text;
using namespace std::chrono_literals;
namespace train = datapar::train;
using datapar::testing::ProcessResult;
using datapar::testing::run_processes;
using datapar::testing::TempDir;

std::string bin(const std::string& name) { return std::string(DATAPAR_BIN_DIR) + "/" + name; }

// `datapar launch ARGS` run to the end (deadline 60 s).
ProcessResult launch(const std::vector<std::string>& args) {
  std::vector<std::string> command = {bin("datapar"), "launch"};
  command.insert(command.end(), args.begin(), args.end());
  bool timed_out = false;
  const TempDir logs("launch_test");
  ProcessResult r = run_processes({command}, logs.path(), 60s, &timed_out)[0];
  EXPECT_FALSE(timed_out) << "datapar launch did not finish in 60 s:\n" << r.output;
  return r;
}

// A launcher started in the background, for tests that signal it.
struct Background {
  pid_t pid = -1;
  std::string log;
};

Background start_launch(const std::vector<std::string>& args, const std::string& dir) {
  Background b;
  b.log = dir + "/launcher.log";
  std::vector<std::string> command = {bin("datapar"), "launch"};
  command.insert(command.end(), args.begin(), args.end());
  b.pid = datapar::testing::start_logged(command, b.log);
  return b;
}

// Waits for `pid` to end (SIGKILLs it after `deadline`); its exit code or 128 + signal.
int wait_exit(pid_t pid, std::chrono::seconds deadline) {
  const datapar::detail::ChildExit exit = datapar::detail::wait_child(pid, std::chrono::steady_clock::now() + deadline);
  if (!exit.timed_out) return datapar::testing::exit_status(exit);
  ADD_FAILURE() << "process " << pid << " still running after " << deadline.count() << " s";
  return -1;
}

// The pids the workers wrote to DIR/pid-RANK, once all `n` exist (empty after 30 s).
std::vector<pid_t> worker_pids(const std::string& dir, int n) {
  const auto end = std::chrono::steady_clock::now() + 30s;
  std::vector<pid_t> pids;
  while (std::chrono::steady_clock::now() < end) {
    pids.clear();
    for (int r = 0; r < n; ++r) {
      const std::string text = read_text(dir + "/pid-" + std::to_string(r));
      if (!text.empty()) pids.push_back(std::stoi(text));
    }
    if (static_cast<int>(pids.size()) == n) return pids;
    std::this_thread::sleep_for(20ms);
  }
  ADD_FAILURE() << "the workers did not all write their pid files in " << dir;
  return {};
}

// Gone, or a zombie nobody reaped yet (an orphan's new parent may be slow to reap it).
bool is_dead(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X');
}

// True if every pid is dead within `deadline`; kills survivors so that a failure leaves none.
bool all_die(const std::vector<pid_t>& pids, std::chrono::seconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    bool all = true;
    for (pid_t p : pids) all &= is_dead(p);
    if (all) return true;
    if (std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(20ms);
  }
  for (pid_t p : pids) ::kill(p, SIGKILL);
  return false;
}

// Every line the workers printed, with its rank prefix, for each of `nproc` ranks.
void expect_environment(const std::string& output, int nproc, int nnodes, int node_rank) {
  const std::regex line(R"(\[rank (\d+)\] RANK=(\d+) LOCAL_RANK=(\d+) WORLD_SIZE=(\d+) LOCAL_WORLD_SIZE=(\d+) )"
                        R"(GROUP_RANK=(\d+) MASTER_ADDR=(\S+) MASTER_PORT=(\d+) TOKEN=(\S+) RUN_ID=\S+ RESTART=(\d+))");
  std::set<int> ranks, ports;
  std::set<std::string> tokens;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[2]), rank);
    EXPECT_EQ(std::stoi(m[3]), rank - node_rank * nproc);
    EXPECT_EQ(std::stoi(m[4]), nnodes * nproc);
    EXPECT_EQ(std::stoi(m[5]), nproc);
    EXPECT_EQ(std::stoi(m[6]), node_rank);
    EXPECT_EQ(m[7], "127.0.0.1");
    EXPECT_EQ(std::stoi(m[10]), 0);
    ranks.insert(rank);
    ports.insert(std::stoi(m[8]));
    tokens.insert(m[9]);
  }
  EXPECT_EQ(static_cast<int>(ranks.size()), nproc) << output;
  EXPECT_EQ(*ranks.begin(), node_rank * nproc) << output;
  EXPECT_EQ(ports.size(), 1u) << "every worker must get the same MASTER_PORT:\n" << output;
  EXPECT_GT(*ports.begin(), 0) << output;
  EXPECT_EQ(tokens.size(), 1u) << "every worker must get the same token:\n" << output;
}

// The launcher forks its workers; jobs on MPI or Slurm start without it
// (tests/tools/mpirun_job_test.cc, tests/tools/slurm_job_test.cc).
TEST(Launch, EnvironmentOfTwoAndThreeWorkers) {
  ::unsetenv("DATAPAR_RUN_ID");
  std::set<std::string> run_ids;
  for (int nproc : {2, 3}) {
    const ProcessResult r = launch({"--nproc-per-node", std::to_string(nproc), "--", bin("launch_probe"), "env"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_environment(r.output, nproc, 1, 0);
    EXPECT_TRUE(std::regex_search(r.output, std::regex("TOKEN=[0-9a-f]{32} "))) << "a fresh random token:\n" << r.output;
    // Each job its own identity (issue 27: two jobs on one port and token trained together).
    std::smatch run_id;
    ASSERT_TRUE(std::regex_search(r.output, run_id, std::regex("RUN_ID=([0-9a-f]{32}) "))) << r.output;
    EXPECT_EQ(count(r.output, "RUN_ID=" + run_id[1].str()), nproc) << "one run id for all workers:\n" << r.output;
    run_ids.insert(run_id[1].str());
    // The port the launcher chose stays its own while the workers start: a port found free
    // and let go could be taken by any process before rank 0 binds it.
    EXPECT_EQ(count(r.output, "MASTER_PORT_HELD=yes"), nproc) << r.output;
  }
  EXPECT_EQ(run_ids.size(), 2u) << "two jobs, one run id";
}

TEST(LaunchNodes, SecondNodeOfTwoGetsItsRanksTokenAndPort) {
  // The second node of two: ranks 2 and 3 of 4; the given token and port are passed on.
  ::unsetenv("DATAPAR_RUN_ID");
  const ProcessResult r = launch({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-port",
                                      "29999", "--token", "secret", "--", bin("launch_probe"), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_environment(r.output, 2, 2, 1);
  EXPECT_NE(r.output.find("MASTER_PORT=29999 TOKEN=secret RUN_ID=- "), std::string::npos)
      << "several nodes without --run-id: the token is the job's identity:\n" << r.output;
  const ProcessResult named = launch({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--master-port",
                                      "29999", "--token", "secret", "--run-id", "job-7", "--", bin("launch_probe"),
                                      "env"});
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_NE(named.output.find("TOKEN=secret RUN_ID=job-7 "), std::string::npos) << named.output;
  EXPECT_NE(r.output.find("BACKEND=- MPI_WORLD=-"), std::string::npos) << "several nodes: forked, Gloo:\n" << r.output;
}

// Finding: --token puts the secret in argv, where `ps` shows it to every user. --token-file
// reads it from a file instead; --token still works, with a warning.
TEST(LaunchNodes, TokenFileKeepsTheTokenOutOfArgv) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const std::string file = dir + "/token";
  std::ofstream(file) << "from-a-file\n";
  ::chmod(file.c_str(), 0600);
  const std::vector<std::string> two_nodes = {"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
                                              "--master-port", "29999"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = two_nodes;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", bin("launch_probe"), "env"});
    return launch(args);
  };
  ::unsetenv("DATAPAR_STORE_TOKEN");
  ProcessResult r = with({"--token-file", file});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TOKEN=from-a-file "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("visible"), std::string::npos) << r.output;
  r = with({"--token", "on-the-command-line"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TOKEN=on-the-command-line "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--token is visible to every user of this machine"), std::string::npos) << r.output;
  r = with({"--token-file", dir + "/missing"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir + "/missing"), std::string::npos) << r.output;
  r = with({"--token-file", file, "--token", "both"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Issue 46: a FIFO blocked open() for ever, /dev/zero read without bound.
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = with({"--token-file", fifo});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a regular file"), std::string::npos) << r.output;
  r = with({"--token-file", "/dev/zero"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/dev/zero is not a regular file"), std::string::npos) << r.output;
  const std::string big = dir + "/big";
  std::ofstream(big) << std::string(5000, 'x');
  r = with({"--token-file", big});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("has 5000 bytes; a token is one short line"), std::string::npos) << r.output;
}

// Forked workers get their own share of the cores (Note [Binding workers to cores]), or all
// of them with --cpu-bind none.
TEST(LaunchDefault, BindsEachWorkerToItsShareOfTheCores) {
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "needs at least 2 cores to split";
  const std::string show = "grep Cpus_allowed_list /proc/self/status";
  const auto cores_of = [](const std::string& output, int rank) {
    const std::string tag = "[rank " + std::to_string(rank) + "] Cpus_allowed_list:";
    const size_t at = output.find(tag);
    if (at == std::string::npos) return std::string("?");
    const size_t begin = output.find_first_not_of(" \t", at + tag.size());
    return output.substr(begin, output.find('\n', begin) - begin);
  };
  const ProcessResult bound = launch({"--nproc-per-node", "2", "--", "sh", "-c", show});
  ASSERT_EQ(bound.exit_code, 0) << bound.output;
  const ProcessResult free = launch({"--cpu-bind", "none", "--nproc-per-node", "2", "--", "sh", "-c", show});
  ASSERT_EQ(free.exit_code, 0) << free.output;
  EXPECT_NE(cores_of(bound.output, 0), cores_of(bound.output, 1)) << bound.output;
  EXPECT_EQ(cores_of(free.output, 0), cores_of(free.output, 1)) << free.output;
  EXPECT_NE(cores_of(bound.output, 0), cores_of(free.output, 0)) << bound.output << free.output;
  const ProcessResult wrong = launch({"--cpu-bind", "numa", "--", "true"});
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
}

// The default single-node path (issue 14): `datapar launch` without flags forks the workers,
// names no backend for them, and what names none runs on Gloo (whose groups within one
// machine go through shared memory: tests/process_group/shared_memory_test.cc). No mpirun.
TEST(LaunchDefault, OneNodeIsForkedAndRunsOnGloo) {
  const ProcessResult env = launch({"--nproc-per-node", "2", "--", bin("launch_probe"), "env"});
  ASSERT_EQ(env.exit_code, 0) << env.output;
  for (int rank : {0, 1}) {
    EXPECT_NE(env.output.find("[rank " + std::to_string(rank) + "] RANK=" + std::to_string(rank)), std::string::npos);
  }
  EXPECT_EQ(std::count_if(env.output.begin(), env.output.end(), [](char c) { return c == '\n'; }), 6) << env.output;
  EXPECT_NE(env.output.find("BACKEND=- MPI_WORLD=-"), std::string::npos) << env.output;

  // A real job: the collectives benchmark, which names no backend, runs on Gloo.
  const ProcessResult bench = launch({"--nproc-per-node", "2", "--", bin("datapar"), "bench", "collectives",
                                          "--sizes", "4KiB,1MiB", "--iters", "3"});
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("[rank 0] datapar bench collectives: all_reduce, backend gloo, 2 processes"),
            std::string::npos)
      << bench.output;
  EXPECT_NE(bench.output.find("[rank 0] | 1 MiB |"), std::string::npos) << bench.output;
}

// A launcher only forks, waits and forwards output: loading libtorch would cost every job's
// start 0.5-0.8 s for nothing. The worker reads its parent's (the launcher's) memory map.
TEST(LaunchDefault, TheLauncherLoadsNoLibtorch) {
  const ProcessResult r = launch({"--nproc-per-node", "1", "--", "/bin/sh", "-c", "cat /proc/$PPID/maps"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("libc.so"), std::string::npos) << "not the launcher's map:\n" << r.output;
  EXPECT_EQ(r.output.find("libtorch"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("libc10"), std::string::npos) << r.output;
}

TEST(Launch, PrefixesEveryLineWithTheRank) {
  const ProcessResult r = launch({"--nproc-per-node", "3", "--", bin("launch_probe"), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_NE(r.output.find(p + "to stderr from " + std::to_string(rank) + "\n"), std::string::npos) << r.output;
    // The last line had no newline: flushed whole when the worker ended.
    EXPECT_NE(r.output.find(p + "no newline from " + std::to_string(rank) + "\n"), std::string::npos) << r.output;
  }
  std::istringstream lines(r.output);
  std::string l;
  while (std::getline(lines, l)) EXPECT_EQ(l.rfind("[rank ", 0), 0u) << "unprefixed line: " << l;
}

TEST(Launch, FailingWorkerStopsTheOthers) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const ProcessResult r = launch({"--nproc-per-node", "3", "--", bin("launch_probe"), "fail", dir, "1", "7"});
  EXPECT_EQ(r.exit_code, 7) << r.output;
  // Timing-free check that SIGTERM alone stopped them (a loaded machine makes wall time useless).
  EXPECT_EQ(r.output.find("killing them (SIGKILL)"), std::string::npos) << r.output;
  const std::vector<pid_t> pids = worker_pids(dir, 3);
  ASSERT_EQ(pids.size(), 3u);
  const std::string summary = "datapar launch: rank 1 (local rank 1, pid " + std::to_string(pids[1]) +
                              ") exited with code 7; stopped the other 2 workers\n";
  EXPECT_NE(r.output.find(summary), std::string::npos) << r.output;
  EXPECT_TRUE(all_die(pids, 1s));
}

// A rank that stops responding (SIGSTOP: alive, holding its sockets) ends the job within the
// group's timeout (3 s) plus the launcher's grace period, with the collective's error. The
// same under a user's own mpirun: tests/tools/mpirun_job_test.cc.
TEST(Launch, HungRankEndsTheJobWithinTheTimeout) {
  const ProcessResult r = launch({"--nproc-per-node", "2", "--grace-period", "2", "--", bin("launch_probe"), "hang"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 hangs now"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launch_probe: "), std::string::npos) << "no error from the waiting rank:\n" << r.output;
  EXPECT_NE(r.output.find("rank 1 did not arrive"), std::string::npos) << "the error names the hung rank:\n" << r.output;
}

// Issue 27: with rank 0 stopped, the store it serves is silent too. The others were never
// warned (the stall inspector waited on the store for the whole timeout) and failed
// without naming anyone. Now the warning comes at the stall interval (1 s here), saying
// that the job's store does not answer and who serves it, and so does the error. Over
// TCP (no shared memory, which names a missing rank by itself), as between machines.
TEST(Launch, AStoppedStoreHostIsNamedAtTheStallIntervalAndInTheError) {
  ::setenv("DATAPAR_SHM", "0", 1);
  const ProcessResult r =
      launch({"--nproc-per-node", "2", "--grace-period", "1", "--", bin("launch_probe"), "hang", "gloo", "6", "0"});
  ::unsetenv("DATAPAR_SHM");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 0 hangs now"), std::string::npos) << r.output;
  const size_t warning = r.output.find("collective 2 of this group, has not completed after ");
  ASSERT_NE(warning, std::string::npos) << "no stall warning:\n" << r.output;
  EXPECT_NE(r.output.find(" s, and the job's store at 127.0.0.1:", warning), std::string::npos) << r.output;
  const size_t error = r.output.find("launch_probe: ");
  ASSERT_NE(error, std::string::npos) << "no error from rank 1:\n" << r.output;
  EXPECT_LT(warning, error) << "the warning comes before the timeout's error:\n" << r.output;
  EXPECT_NE(r.output.find("rank 0, which serves it, has exited, is stopped or is hung", error), std::string::npos)
      << r.output;
}

TEST(Launch, WorkerKilledByASignalGives128PlusTheSignal) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const ProcessResult r = launch({"--nproc-per-node", "2", "--", bin("launch_probe"), "fail", dir, "0", "-9"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  const std::vector<pid_t> pids = worker_pids(dir, 2);
  ASSERT_EQ(pids.size(), 2u);
  const std::string summary = "datapar launch: rank 0 (local rank 0, pid " + std::to_string(pids[0]) +
                              ") was killed by signal 9 (Killed); stopped the other 1 worker\n";
  EXPECT_NE(r.output.find(summary), std::string::npos) << r.output;
}

TEST(Launch, SigtermStopsEveryWorker) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const Background b = start_launch({"--nproc-per-node", "3", "--", bin("launch_probe"), "sleep", dir}, dir);
  ASSERT_GT(b.pid, 0);
  const std::vector<pid_t> pids = worker_pids(dir, 3);
  ::kill(b.pid, SIGTERM);
  EXPECT_EQ(wait_exit(b.pid, 10s), 128 + SIGTERM);
  EXPECT_TRUE(all_die(pids, 1s));
  EXPECT_NE(read_text(b.log).find("datapar launch: got SIGTERM; forwarding it to 3 workers"), std::string::npos)
      << read_text(b.log);
}

TEST(Launch, KillsWorkersThatIgnoreSigtermAfterTheGracePeriod) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const Background b = start_launch(
      {"--nproc-per-node", "2", "--grace-period", "0.5", "--", bin("launch_probe"), "sleep", dir, "ignore-term"}, dir);
  ASSERT_GT(b.pid, 0);
  const std::vector<pid_t> pids = worker_pids(dir, 2);
  ::kill(b.pid, SIGTERM);
  EXPECT_EQ(wait_exit(b.pid, 10s), 128 + SIGTERM);
  EXPECT_TRUE(all_die(pids, 1s));
  EXPECT_NE(read_text(b.log).find("2 workers still running 500 ms after SIGTERM; killing them"), std::string::npos)
      << read_text(b.log);
}

TEST(Launch, NoOrphansAfterTheLauncherIsKilled) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const Background b = start_launch({"--nproc-per-node", "3", "--", bin("launch_probe"), "sleep", dir}, dir);
  ASSERT_GT(b.pid, 0);
  const std::vector<pid_t> pids = worker_pids(dir, 3);
  ASSERT_EQ(pids.size(), 3u);
  ::kill(b.pid, SIGKILL);  // no chance to clean up: the workers must die by themselves
  EXPECT_EQ(wait_exit(b.pid, 10s), 128 + SIGKILL);
  EXPECT_TRUE(all_die(pids, 5s)) << "workers outlived a SIGKILLed launcher";
}

// Issue 27: what a worker started dies too. The worker here is a shell that runs the real
// work in the background, so only the shell is the launcher's child (and dies with it by
// PR_SET_PDEATHSIG); the `sleep` it started used to live on, orphaned.
TEST(Launch, WhatTheWorkersStartedDiesWithAKilledLauncher) {
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  const Background b = start_launch(
      {"--nproc-per-node", "2", "--", "/bin/sh", "-c", "sleep 300 & echo $! > " + dir + "/pid-$RANK; wait"}, dir);
  ASSERT_GT(b.pid, 0);
  const std::vector<pid_t> pids = worker_pids(dir, 2);
  ASSERT_EQ(pids.size(), 2u);
  ::kill(b.pid, SIGKILL);
  EXPECT_EQ(wait_exit(b.pid, 10s), 128 + SIGKILL);
  EXPECT_TRUE(all_die(pids, 10s)) << "what the workers started outlived a SIGKILLed launcher:\n" << read_text(b.log);
}

// Adds process `name` (a /proc entry) to `out` if it is a worker of `launcher`'s attempt
// `restart`.
void add_worker(const std::string& name, pid_t launcher, int restart, std::map<int, pid_t>* out) {
  const std::string stat = read_text("/proc/" + name + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return;
  std::istringstream fields(stat.substr(paren + 2));
  char state = 0;
  pid_t parent = 0;
  fields >> state >> parent;
  if (parent != launcher || state == 'Z') return;
  std::string environment = read_text("/proc/" + name + "/environ");
  std::replace(environment.begin(), environment.end(), '\0', '\n');
  std::smatch rank, attempt;
  static const std::regex rank_line("(^|\n)RANK=(\\d+)"), restart_line("(^|\n)DATAPAR_RESTART_COUNT=(\\d+)");
  if (std::regex_search(environment, rank, rank_line) && std::regex_search(environment, attempt, restart_line) &&
      std::stoi(attempt[2]) == restart) {
    (*out)[std::stoi(rank[2])] = static_cast<pid_t>(std::stol(name));
  }
}

// The workers of `launcher`'s attempt `restart` (its children whose environment has
// DATAPAR_RESTART_COUNT=restart), by RANK.
std::map<int, pid_t> workers_of(pid_t launcher, int restart) {
  std::map<int, pid_t> out;
  for (const std::string& name : datapar::detail::list_directory("/proc")) {
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    try {
      add_worker(name, launcher, restart, &out);
    } catch (const std::exception&) {
      // The process ended while it was read: read() fails with ESRCH, which libstdc++'s filebuf
      // throws whatever the stream's exception mask (as an ios_base::failure of the library's
      // ABI, which a catch of this ABI's ios_base::failure may miss: GCC bug 66145). Not a
      // worker any more.
    }
  }
  return out;
}

// Issue 28: a tool run with --nproc is its own ranks' launcher. A rank that dies stops the
// other at once (forked ranks used to wait in a collective for the whole group timeout),
// and a SIGTERM to the tool reaches every rank (forked ranks used to run on).
TEST(Launch, ABenchmarksRanksAreSupervisedAsWorkers) {
  const TempDir temp("launch_test");
  const std::vector<std::string> bench = {bin("datapar"), "bench", "ddp", "--model", "mlp", "--nproc", "2",
                                          "--steps", "100000000", "--warmup", "0"};
  for (const bool kill_a_rank : {true, false}) {
    const std::string log = temp.path() + (kill_a_rank ? "/killed_rank.log" : "/sigterm.log");
    const pid_t tool = datapar::testing::start_logged(bench, log);
    ASSERT_GT(tool, 0);
    std::map<int, pid_t> ranks;
    for (const auto deadline = std::chrono::steady_clock::now() + 60s;
         ranks.size() < 2 && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(10ms)) {
      ranks = workers_of(tool, 0);
    }
    ASSERT_EQ(ranks.size(), 2u) << read_text(log);
    ::kill(kill_a_rank ? ranks[1] : tool, kill_a_rank ? SIGKILL : SIGTERM);
    EXPECT_EQ(wait_exit(tool, 30s), 128 + (kill_a_rank ? SIGKILL : SIGTERM)) << read_text(log);
    EXPECT_TRUE(all_die({ranks[0], ranks[1]}, 1s)) << read_text(log);
    const std::string said = kill_a_rank ? "datapar bench ddp: rank 1 (local rank 1, pid " + std::to_string(ranks[1]) +
                                               ") was killed by signal 9 (Killed); stopped the other 1 worker"
                                         : "datapar bench ddp: got SIGTERM; forwarding it to 2 workers";
    EXPECT_NE(read_text(log).find(said), std::string::npos) << read_text(log);
  }
}

// The highest epoch of the checkpoints in `dir` (0: none yet).
int latest_epoch(const std::string& dir) {
  int latest = 0;
  static const std::regex checkpoint("checkpoint-epoch-(\\d+)\\.pt");
  for (const std::string& name : datapar::detail::list_directory(dir)) {
    std::smatch m;
    if (std::regex_match(name, m, checkpoint)) latest = std::max(latest, std::stoi(m[1]));
  }
  return latest;
}

// Chaos: a DDP job under --max-restarts 3 whose workers are SIGKILLed three times, each time
// a random rank at a random moment (seeded) of a random epoch, ends with exactly the
// parameters of a job that was never interrupted: every restart resumes from the last
// checkpoint and replays the same batches.
TEST(LaunchChaos, ThreeRandomKillsEndWithTheParametersOfAnUninterruptedRun) {
  const auto train = [](const std::string& checkpoints) {
    return std::vector<std::string>{"--nproc-per-node", "2", "--max-restarts", "3", "--", bin("datapar"), "train",
                                    "--mode", "ddp", "--backend", "gloo", "--model", "mlp", "--epochs", "8",
                                    "--batch-size", "64", "--limit", "3000", "--threads", "1", "--workers", "1",
                                    "--checkpoint-dir", checkpoints};
  };
  const TempDir straight_dir("launch_test");
  const ProcessResult straight = launch(train(straight_dir.path()));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  const TempDir chaos_temp("launch_test"), logs("launch_test");
  const std::string& chaos_dir = chaos_temp.path();
  const Background b = start_launch(train(chaos_dir), logs.path());
  ASSERT_GT(b.pid, 0);
  std::mt19937 random(20261124);
  int epoch_seen = 0;
  for (int kill = 0; kill < 3; ++kill) {
    // Wait for this attempt's workers and for a checkpoint newer than the last kill's, then
    // a random moment within the next epoch.
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    const int after = epoch_seen + 1 + static_cast<int>(random() % 2);
    std::map<int, pid_t> workers;
    while (std::chrono::steady_clock::now() < deadline) {
      workers = workers_of(b.pid, kill);
      if (workers.size() == 2 && latest_epoch(chaos_dir) >= after) break;
      std::this_thread::sleep_for(5ms);
    }
    ASSERT_EQ(workers.size(), 2u) << "attempt " << kill << " has no two workers:\n" << read_text(b.log);
    ASSERT_GE(latest_epoch(chaos_dir), after) << read_text(b.log);
    epoch_seen = latest_epoch(chaos_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 300));
    const int victim = static_cast<int>(random() % 2);
    ASSERT_EQ(::kill(workers[victim], SIGKILL), 0) << "rank " << victim << " of attempt " << kill;
  }
  EXPECT_EQ(wait_exit(b.pid, 180s), 0) << read_text(b.log);
  const std::string log = read_text(b.log);
  EXPECT_NE(log.find("restart 3 of 3"), std::string::npos) << log;

  const train::Checkpoint expected = train::load_checkpoint(train::checkpoint_path(straight_dir.path(), 8));
  const train::Checkpoint got = train::load_checkpoint(train::checkpoint_path(chaos_dir, 8));
  ASSERT_EQ(got.model.size(), expected.model.size());
  for (const auto& item : expected.model) {
    const at::Tensor* other = got.model.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(*other, item.value())) << item.key() << " differs from the uninterrupted run";
  }
}

// Every tensor of a checkpoint's optimizer state, by "<parameter>/<name>" (SGD's momentum).
std::map<std::string, at::Tensor> optimizer_tensors(const datapar::OptimizerState& optimizer) {
  std::map<std::string, at::Tensor> out;
  for (const auto& part : optimizer) {
    if (!part.key().isString() || part.key().toStringRef() != "state") continue;
    for (const auto& param : part.value().toGenericDict()) {
      for (const auto& entry : param.value().toGenericDict()) {
        std::ostringstream name;
        name << param.key() << '/' << entry.key();
        if (entry.value().isTensor()) out[name.str()] = entry.value().toTensor();
      }
    }
  }
  return out;
}

// The models and the optimizers' momentum of two checkpoints agree within 1e-5 relative
// (float round-off: the steps of a fault-tolerant run sum their gradients over however many
// ranks were alive).
// Within `tolerance` relative to the largest element of each tensor (0: equal to the bit).
void expect_same_model(const std::string& expected_path, const std::string& got_path, double tolerance = 1e-5) {
  const train::Checkpoint expected = train::load_checkpoint(expected_path);
  const train::Checkpoint got = train::load_checkpoint(got_path);
  const auto difference = [](const at::Tensor& a, const at::Tensor& b) {
    const double scale = std::max(1e-12, a.abs().max().item<double>());
    return (a - b).abs().max().item<double>() / scale;
  };
  ASSERT_EQ(got.model.size(), expected.model.size());
  for (const auto& item : expected.model) {
    const at::Tensor* other = got.model.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_LE(difference(item.value(), *other), tolerance) << item.key();
  }
  const std::map<std::string, at::Tensor> want = optimizer_tensors(expected.optimizer);
  const std::map<std::string, at::Tensor> have = optimizer_tensors(got.optimizer);
  EXPECT_FALSE(want.empty()) << expected_path << " has no optimizer state";
  ASSERT_EQ(have.size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_EQ(have.count(name), 1u) << "optimizer state " << name;
    EXPECT_LE(difference(tensor, have.at(name)), tolerance) << "optimizer state " << name;
  }
}

// The checkpoint directory of `job(dir)` launched and run to its end, run once per process for
// each distinct job: the tests that compare against the same uninterrupted run share it (each
// costs ~20 s of two cores under AddressSanitizer). Empty, with the failure added, if it failed.
template <typename Job>
std::string uninterrupted_run(const Job& job) {
  static std::map<std::vector<std::string>, std::unique_ptr<TempDir>> runs;
  std::unique_ptr<TempDir>& dir = runs[job("<dir>")];
  if (!dir) {
    auto made = std::make_unique<TempDir>("launch_test");
    const ProcessResult r = launch(job(made->path()));
    if (r.exit_code != 0) {
      ADD_FAILURE() << "the uninterrupted run failed:\n" << r.output;
      return "";
    }
    dir = std::move(made);
  }
  return dir->path();
}

// The killed job runs `mode` (ddp, fsdp, or hsdp in shard groups of two), with its
// optimizer state sharded if `zero` (--zero), on `workers` workers; the uninterrupted one is
// plain ddp. Rank 1 is killed. Both with `amp` (--amp).
void a_killed_worker_is_restarted_alone(const std::string& mode, bool zero, int size = 3,
                                        const std::string& amp = "none") {
  constexpr int kEpochs = 4;
  const auto train = [size, amp](const std::string& checkpoints, const std::string& how, bool sharded) {
    std::vector<std::string> args{"--fault-tolerant", "--nproc-per-node", std::to_string(size), "--max-restarts",
                                  "1", "--", bin("datapar"), "train", "--fault-tolerant",
                                  "--mode", how, "--backend", "gloo", "--model", "lenet", "--epochs",
                                  std::to_string(kEpochs), "--batch-size", "48", "--limit", "6000", "--threads",
                                  "1", "--workers", "1", "--momentum", "0.9", "--checkpoint-dir", checkpoints};
    if (sharded) args.push_back("--zero");
    if (how == "hsdp") args.insert(args.end(), {"--shard-size", "2"});
    if (amp != "none") args.insert(args.end(), {"--amp", amp});
    return args;
  };
  const std::string straight = uninterrupted_run([&](const std::string& dir) { return train(dir, "ddp", false); });
  ASSERT_FALSE(straight.empty());

  const TempDir killed_dir("launch_test"), logs("launch_test");
  const Background b = start_launch(train(killed_dir.path(), mode, zero), logs.path());
  ASSERT_GT(b.pid, 0);
  std::map<int, pid_t> workers;
  for (const auto deadline = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(5ms)) {
    workers = workers_of(b.pid, 0);
    if (workers.size() == static_cast<size_t>(size) && latest_epoch(killed_dir.path()) >= 1) break;
  }
  ASSERT_EQ(workers.size(), static_cast<size_t>(size)) << read_text(b.log);
  std::mt19937 random(31);
  std::this_thread::sleep_for(std::chrono::milliseconds(random() % 200));
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);
  std::map<int, pid_t> replacement;
  for (const auto deadline = std::chrono::steady_clock::now() + 30s;
       replacement.empty() && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    replacement = workers_of(b.pid, 1);
  }
  ASSERT_EQ(replacement.count(1), 1u) << "rank 1 was not restarted:\n" << read_text(b.log);
  // The others were not restarted: the same processes run on.
  const std::map<int, pid_t> first = workers_of(b.pid, 0);
  EXPECT_EQ(first.size() - first.count(1), static_cast<size_t>(size - 1)) << read_text(b.log);
  EXPECT_EQ(wait_exit(b.pid, 120s), 0) << read_text(b.log);
  const std::string log = read_text(b.log);
  EXPECT_NE(log.find("restarting it alone (restart 1 of 1); the other workers go on"), std::string::npos) << log;
  // The replacement took part: the last epoch was trained by every rank again.
  EXPECT_NE(log.find("epoch 4/4"), std::string::npos) << log;
  EXPECT_NE(log.substr(log.find("epoch 4/4")).find(std::to_string(size) + " ranks"), std::string::npos) << log;

  expect_same_model(train::checkpoint_path(straight, kEpochs), train::checkpoint_path(killed_dir.path(), kEpochs));
  if (amp == "fp16") {  // the job's scale, beside the checkpoint: the uninterrupted run's
    const std::string scale = "/grad-scaler-epoch-" + std::to_string(kEpochs) + "-rank-0.pt";
    const datapar::StateDict want = datapar::load_state_dict_file(straight + scale);
    const datapar::StateDict got = datapar::load_state_dict_file(killed_dir.path() + scale);
    for (const char* key : {"scale", "_growth_tracker"}) {
      EXPECT_EQ(got[key].item<double>(), want[key].item<double>()) << key;
    }
  }
}

// Issue 31: under --fault-tolerant a SIGKILLed worker is restarted alone: the others go on
// (the same processes), the replacement joins the running job and takes its state from a
// peer, and the job ends with the parameters of one that was never interrupted, within
// 1e-5 relative (the steps after the kill are cut over two ranks, then three again, so the
// sums run in another order: no bitwise equality).
TEST(LaunchFaultTolerant, AKilledWorkerIsRestartedAloneAndTheJobEndsAsAnUninterruptedOne) {
  a_killed_worker_is_restarted_alone("ddp", /*zero=*/false);
}

// --zero: each rank keeps two of the three shards of the momentum; the kill loses none, the
// replacement takes its shards from the others, and the last checkpoint (the model, and the
// momentum gathered from the shards) is the uninterrupted unsharded run's.
TEST(LaunchFaultTolerant, AKilledWorkerOfAShardedJobLosesNoOptimizerState) {
  a_killed_worker_is_restarted_alone("ddp", /*zero=*/true);
}

// --mode fsdp: each rank keeps its shard of the model and optimizer state and the previous
// rank's; the kill loses none, the survivors put the model together and shard it anew over
// two ranks, then three again with the replacement, and the last checkpoint (gathered from
// the shards) is the uninterrupted ddp run's.
TEST(LaunchFaultTolerant, AKilledWorkerOfAnFsdpJobLosesNoShard) { a_killed_worker_is_restarted_alone("fsdp", false); }

// --amp fp16, float16 autocast with the gradient scaler: a step with an overflow is skipped
// on every member and the scale changes only with committed steps; the replacement takes the
// scale with the model. The last checkpoint and the scale beside it are those of the
// uninterrupted fp16 run.
TEST(LaunchFaultTolerant, AKilledWorkerOfAFloat16JobTakesTheScaleWithTheModel) {
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "libtorch 1.x has no float16 autocast on the CPU (datapar train refuses --amp fp16 there); "
                  "FaultTolerantDdp.GradScalerSkipsOverflowsOnEveryMemberAndAReplacementTakesTheScale checks the "
                  "protocol on this line";
#else
  a_killed_worker_is_restarted_alone("ddp", /*zero=*/false, 3, "fp16");
#endif
}

// Issue 47, --mode hsdp --shard-size 2 on four workers: rank 1 killed takes its replica group
// (ranks 0 and 1) out of the job; ranks 2 and 3 train on; the restarted rank 1 and rank 0
// take their shards from ranks 2 and 3, and the last checkpoint is the uninterrupted ddp
// run's.
TEST(LaunchFaultTolerant, AKilledWorkerOfAnHsdpJobTakesItsReplicaGroupOutAndBack) {
  a_killed_worker_is_restarted_alone("hsdp", false, 4);
}

// Issue 48, --mode ddp --fault-tolerant --sync-every 5 (ft::FaultTolerantDiLoCo, a round a
// step) on three workers: rank 1 SIGKILLed in the middle of epoch 2 (most likely in its inner
// steps) costs its own inner steps only. The two others (the same processes) average the
// round over themselves and commit rounds on as a membership of two until the replacement
// joins at a round boundary; the job ends with exit 0, the last checkpoint and DiLoCo's state
// beside it, and a model that learned.
TEST(LaunchFaultTolerant, AKilledDiLoCoMemberCostsOnlyItsInnerSteps) {
  constexpr int kEpochs = 3;
  const TempDir checkpoints("launch_test"), logs("launch_test");
  const Background b = start_launch(
      {"--fault-tolerant", "--nproc-per-node", "3", "--max-restarts", "1", "--", bin("datapar"), "train",
       "--fault-tolerant", "--mode", "ddp", "--sync-every", "5", "--outer-lr", "0.5", "--backend", "gloo", "--model",
       "mlp", "--epochs", std::to_string(kEpochs), "--batch-size", "48", "--limit", "12000", "--threads", "1",
       "--workers", "1", "--momentum", "0", "--checkpoint-dir", checkpoints.path()},
      logs.path());
  ASSERT_GT(b.pid, 0);
  std::map<int, pid_t> workers;
  for (const auto deadline = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(5ms)) {
    workers = workers_of(b.pid, 0);
    if (workers.size() == 3 && latest_epoch(checkpoints.path()) >= 1) break;
  }
  ASSERT_EQ(workers.size(), 3u) << read_text(b.log);
  ASSERT_EQ(latest_epoch(checkpoints.path()), 1) << "not in epoch 2:\n" << read_text(b.log);
  std::mt19937 random(48);
  std::this_thread::sleep_for(std::chrono::milliseconds(50 + random() % 200));
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);
  std::map<int, pid_t> replacement;
  for (const auto deadline = std::chrono::steady_clock::now() + 30s;
       replacement.empty() && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    replacement = workers_of(b.pid, 1);
  }
  EXPECT_EQ(replacement.count(1), 1u) << "rank 1 was not restarted:\n" << read_text(b.log);
  // Never a restart of the survivors: ranks 0 and 2 run on as the same processes.
  const std::map<int, pid_t> first = workers_of(b.pid, 0);
  EXPECT_EQ(first.count(0) + first.count(2), 2u) << read_text(b.log);
  EXPECT_EQ(wait_exit(b.pid, 120s), 0) << read_text(b.log);
  const std::string log = read_text(b.log);
  EXPECT_NE(log.find("restarting it alone (restart 1 of 1); the other workers go on"), std::string::npos) << log;

  // The survivors committed rounds as two while the victim was away, then with it again.
  static const std::regex membership(R"(membership epoch \d+: (\d) ranks, training from step (\d+))");
  std::vector<std::pair<int, long>> memberships;  // (ranks, step)
  for (std::sregex_iterator m(log.begin(), log.end(), membership), end; m != end; ++m) {
    memberships.emplace_back(std::stoi((*m)[1]), std::stol((*m)[2]));
  }
  const auto two = std::find_if(memberships.begin(), memberships.end(), [](const auto& m) { return m.first == 2; });
  ASSERT_NE(two, memberships.end()) << "no round was committed by the two survivors:\n" << log;
  const auto back = std::find_if(two, memberships.end(), [](const auto& m) { return m.first == 3; });
  if (back != memberships.end()) EXPECT_GT(back->second, two->second) << log;

  // Every epoch reported, the loss falling; the last checkpoint and DiLoCo's state beside it.
  static const std::regex epoch(R"(epoch (\d+)/3  loss ([0-9.]+))");
  std::map<int, double> losses;
  for (std::sregex_iterator m(log.begin(), log.end(), epoch), end; m != end; ++m) {
    losses[std::stoi((*m)[1])] = std::stod((*m)[2]);
  }
  ASSERT_EQ(losses.size(), static_cast<size_t>(kEpochs)) << log;
  EXPECT_LT(losses[kEpochs], losses[1]) << log;
  ASSERT_EQ(latest_epoch(checkpoints.path()), kEpochs) << log;
  const train::Checkpoint last = train::load_checkpoint(train::checkpoint_path(checkpoints.path(), kEpochs));
  EXPECT_FALSE(last.model.size() == 0) << log;
  EXPECT_TRUE(datapar::detail::exists(checkpoints.path() + "/ft-diloco-epoch-3.pt")) << log;
}

// The lines "epoch N: test loss X, test accuracy Y" the fault-tolerant DDP example printed,
// without the count of members.
std::vector<std::string> example_epochs(const std::string& output) {
  static const std::regex line(R"(\] (epoch \d+: test loss [0-9.]+, test accuracy [0-9.]+) \(1000 images\))");
  std::vector<std::string> epochs;
  for (std::sregex_iterator m(output.begin(), output.end(), line), end; m != end; ++m) epochs.push_back((*m)[1]);
  return epochs;
}

// The fault-tolerant DDP example (examples/ft_ddp_fashion_mnist), launched as its header says:
// one of two workers SIGKILLed in epoch 2 and restarted alone, the job prints, epoch by epoch,
// what an undisturbed job prints, to the bit. Its first epoch is one process's within float
// rounding (one process's batch is one slice, not two summed); later epochs are compared to
// the undisturbed job only: with momentum, rounding differences grow (measured on this
// example: 1.5e-4 of the test loss after epoch 1, 4% after epoch 3).
TEST(FtDdpExample, AKilledWorkerIsReplacedAndTheJobPrintsWhatAnUndisturbedOnePrints) {
  const auto job = [](int workers) {
    return std::vector<std::string>{"--fault-tolerant", "--nproc-per-node", std::to_string(workers), "--max-restarts",
                                    "1", "--", bin("ft_ddp_fashion_mnist"), "--epochs", "3"};
  };
  const ProcessResult single = launch(job(1));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const ProcessResult undisturbed = launch(job(2));
  ASSERT_EQ(undisturbed.exit_code, 0) << undisturbed.output;
  const std::vector<std::string> want = example_epochs(undisturbed.output);
  ASSERT_EQ(want.size(), 3u) << undisturbed.output;
  const std::vector<std::string> alone = example_epochs(single.output);
  ASSERT_EQ(alone.size(), 3u) << single.output;
  static const std::regex numbers(R"(test loss ([0-9.]+), test accuracy ([0-9.]+))");
  std::vector<double> losses;
  for (size_t e = 0; e < 3; ++e) {
    std::smatch a, b;
    ASSERT_TRUE(std::regex_search(want[e], a, numbers) && std::regex_search(alone[e], b, numbers));
    losses.push_back(std::stod(a[1]));
    if (e > 0) continue;
    EXPECT_NEAR(std::stod(a[1]), std::stod(b[1]), 1e-3 * std::stod(b[1])) << want[e] << " / " << alone[e];
    EXPECT_NEAR(std::stod(a[2]), std::stod(b[2]), 0.01) << want[e] << " / " << alone[e];
  }
  EXPECT_LT(losses[2], losses[0]) << undisturbed.output;

  const TempDir logs("launch_test");
  const Background b = start_launch(job(2), logs.path());
  ASSERT_GT(b.pid, 0);
  std::map<int, pid_t> workers;
  for (const auto deadline = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(5ms)) {
    workers = workers_of(b.pid, 0);
    if (workers.size() == 2 && !example_epochs(read_text(b.log)).empty()) break;
  }
  ASSERT_EQ(workers.size(), 2u) << read_text(b.log);
  const std::string epoch_1 = read_text(b.log);
  ASSERT_EQ(example_epochs(epoch_1).size(), 1u) << "not in epoch 2:\n" << epoch_1;
  // The worker that does not report (the first member reports: either may be).
  const int reporter = epoch_1.find("[rank 1] epoch 1:") != std::string::npos ? 1 : 0;
  ASSERT_EQ(::kill(workers[1 - reporter], SIGKILL), 0);
  EXPECT_EQ(wait_exit(b.pid, 120s), 0) << read_text(b.log);
  const std::string log = read_text(b.log);
  EXPECT_NE(log.find("restarting it alone (restart 1 of 1)"), std::string::npos) << log;
  EXPECT_EQ(example_epochs(log), want) << log << "\nundisturbed:\n" << undisturbed.output;
}

// A fault-tolerant job stopped after an epoch and started again with --resume goes on from
// its last checkpoint (the model, the optimizer's momentum, the step) and ends as a run that
// was never stopped.
// `mode`: the stopped and resumed job's (the uninterrupted one is ddp); both with `amp` (--amp).
void resume_goes_on_as_an_uninterrupted_run(const std::string& mode, const std::string& amp = "none") {
  const auto train = [amp](const std::string& checkpoints, int epochs, bool resume, const std::string& how) {
    std::vector<std::string> args = {"--fault-tolerant", "--nproc-per-node", "2", "--", bin("datapar"), "train",
                                      "--fault-tolerant", "--mode", how, "--backend", "gloo", "--model", "lenet",
                                      "--epochs", std::to_string(epochs), "--batch-size", "48", "--limit", "2000",
                                      "--threads", "1", "--workers", "1", "--momentum", "0.9", "--checkpoint-dir",
                                      checkpoints};
    if (resume) args.push_back("--resume");
    if (amp != "none") args.insert(args.end(), {"--amp", amp});
    return args;
  };
  const std::string straight = uninterrupted_run([&](const std::string& dir) { return train(dir, 3, false, "ddp"); });
  ASSERT_FALSE(straight.empty());
  const TempDir resumed_dir("launch_test");
  const ProcessResult first = launch(train(resumed_dir.path(), 2, false, mode));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed = launch(train(resumed_dir.path(), 3, true, mode));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + train::checkpoint_path(resumed_dir.path(), 2)), std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.output.find("epoch 2/3"), std::string::npos) << "epoch 2 trained again:\n" << resumed.output;
  EXPECT_NE(resumed.output.find("epoch 3/3"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("no GradScaler state"), std::string::npos) << resumed.output;
  expect_same_model(train::checkpoint_path(straight, 3), train::checkpoint_path(resumed_dir.path(), 3));
  if (amp == "fp16") {  // the job's scale read back: the uninterrupted run's at the end
    const std::string scale = "/grad-scaler-epoch-3-rank-0.pt";
    const datapar::StateDict want = datapar::load_state_dict_file(straight + scale);
    const datapar::StateDict got = datapar::load_state_dict_file(resumed_dir.path() + scale);
    for (const char* key : {"scale", "_growth_tracker"}) {
      EXPECT_EQ(got[key].item<double>(), want[key].item<double>()) << key;
    }
  }
}

TEST(LaunchFaultTolerant, ResumeGoesOnFromTheLastCheckpointAsAnUninterruptedRun) {
  resume_goes_on_as_an_uninterrupted_run("ddp");
}

// --amp fp16: the job's gradient scale beside each checkpoint is read back on --resume.
TEST(LaunchFaultTolerant, AFloat16JobResumesItsScaleAsAnUninterruptedRun) {
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "libtorch 1.x has no float16 autocast on the CPU (datapar train refuses --amp fp16 there)";
#else
  resume_goes_on_as_an_uninterrupted_run("ddp", "fp16");
#endif
}

// Under fsdp each rank takes its shard of the checkpoint's model and optimizer state.
TEST(LaunchFaultTolerant, AnFsdpJobResumesFromTheLastCheckpointAsAnUninterruptedRun) {
  resume_goes_on_as_an_uninterrupted_run("fsdp");
}

// --mode ddp --fault-tolerant --sync-every: a job stopped after epoch 2 and started again with
// --resume (the model and DiLoCo's state beside the checkpoint: the outer parameters and
// momentum, the round) ends as one never stopped, to the bit (--momentum 0: the inner SGD has
// no state that only rank 0's checkpoint would hold); without DiLoCo's state it refuses.
TEST(LaunchFaultTolerant, ADiLoCoJobResumesFromTheLastCheckpointAsAnUninterruptedRun) {
  const auto train = [](const std::string& checkpoints, int epochs, bool resume) {
    std::vector<std::string> args = {"--fault-tolerant", "--nproc-per-node", "2", "--", bin("datapar"), "train",
                                     "--fault-tolerant", "--mode", "ddp", "--sync-every", "5", "--outer-lr", "0.5",
                                     "--backend", "gloo", "--model", "mlp", "--epochs", std::to_string(epochs),
                                     "--batch-size", "48", "--limit", "2000", "--threads", "1", "--workers", "1",
                                     "--momentum", "0", "--checkpoint-dir", checkpoints};
    if (resume) args.push_back("--resume");
    return args;
  };
  const TempDir straight_dir("launch_test"), resumed_dir("launch_test");
  const ProcessResult straight = launch(train(straight_dir.path(), 3, false));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const ProcessResult first = launch(train(resumed_dir.path(), 2, false));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(datapar::detail::exists(resumed_dir.path() + "/ft-diloco-epoch-2.pt")) << first.output;
  const ProcessResult resumed = launch(train(resumed_dir.path(), 3, true));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + train::checkpoint_path(resumed_dir.path(), 2)), std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.output.find("epoch 2/3"), std::string::npos) << "epoch 2 trained again:\n" << resumed.output;
  const train::Checkpoint expected = train::load_checkpoint(train::checkpoint_path(straight_dir.path(), 3));
  const train::Checkpoint got = train::load_checkpoint(train::checkpoint_path(resumed_dir.path(), 3));
  ASSERT_EQ(got.model.size(), expected.model.size());
  for (const auto& item : expected.model) {
    const at::Tensor* other = got.model.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(at::equal(*other, item.value())) << item.key() << " differs from the uninterrupted run";
  }

  ASSERT_EQ(datapar::detail::remove_tree(straight_dir.path() + "/ft-diloco-epoch-3.pt"), 1);
  const ProcessResult refused = launch(train(straight_dir.path(), 4, true));
  EXPECT_NE(refused.output.find("no DiLoCo state beside the checkpoint of epoch 3"), std::string::npos)
      << refused.output;
}

// Node 0's launcher serves the store and decides membership: it is the one part whose loss
// ends a fault-tolerant job (docs/fault_tolerance.md). Another node's launcher says so,
// stops its workers instead of restarting them, and exits non-zero.
TEST(LaunchFaultTolerant, LosingNodeZerosLauncherStopsTheOtherNodesWorkersWithTheReason) {
  const datapar::ReservedPort port;
  const TempDir checkpoints("launch_test"), logs0("launch_test"), logs1("launch_test");
  auto node = [&](int node_rank, const std::string& logs) {
    return start_launch({"--fault-tolerant", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank",
                         std::to_string(node_rank), "--master-port", std::to_string(port.port()), "--token", "lose0",
                         "--max-restarts", "3", "--", bin("datapar"), "train", "--fault-tolerant",
                         "--mode", "ddp", "--backend", "gloo", "--model", "mlp", "--epochs", "1000", "--batch-size",
                         "48", "--limit", "2000", "--threads", "1", "--workers", "1", "--checkpoint-dir",
                         checkpoints.path()},
                        logs);
  };
  const Background one = node(1, logs1.path());
  const Background zero = node(0, logs0.path());
  ASSERT_GT(one.pid, 0);
  ASSERT_GT(zero.pid, 0);
  for (const auto deadline = std::chrono::steady_clock::now() + 60s;
       latest_epoch(checkpoints.path()) < 1 && std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(10ms)) {
  }
  ASSERT_GE(latest_epoch(checkpoints.path()), 1) << read_text(zero.log) << "\nnode 1:\n" << read_text(one.log);
  ASSERT_EQ(::kill(zero.pid, SIGKILL), 0);
  wait_exit(zero.pid, 10s);
  EXPECT_EQ(wait_exit(one.pid, 60s), 1) << read_text(one.log);
  const std::string said = read_text(one.log);
  EXPECT_NE(said.find("the job's store at 127.0.0.1:" + std::to_string(port.port()) + " cannot be reached"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("the job cannot go on without it; stopping every worker"), std::string::npos) << said;
  EXPECT_EQ(said.find("restarting it alone"), std::string::npos) << said;
}

// The final weights a `train` run printed.
std::string final_weights(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex(R"(\[rank 0\] final weights([^\n]*))")) ? m[1].str() : "";
}

TEST(Launch, MaxRestartsResumesFromTheLastCheckpoint) {
  const std::string probe = bin("launch_probe");
  const TempDir straight_dir("launch_test"), failed_dir("launch_test"), resumed_dir("launch_test");
  const ProcessResult straight =
      launch({"--nproc-per-node", "2", "--", probe, "train", straight_dir.path(), "4", "-1"});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string expected = final_weights(straight.output);
  ASSERT_FALSE(expected.empty()) << straight.output;

  // Without restarts the failure ends the job.
  const ProcessResult failed = launch({"--nproc-per-node", "2", "--", probe, "train", failed_dir.path(), "4", "2"});
  EXPECT_EQ(failed.exit_code, 3) << failed.output;
  EXPECT_NE(failed.output.find("datapar launch: rank 1 (local rank 1, pid "), std::string::npos) << failed.output;

  const ProcessResult resumed =
      launch({"--nproc-per-node", "2", "--max-restarts", "2", "--", probe, "train", resumed_dir.path(), "4", "2"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("[rank 1] failing at epoch 2"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("datapar launch: restarting all 2 workers (restart 1 of 2)"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("[rank 0] resuming at epoch 2"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("restart 2 of 2"), std::string::npos) << resumed.output;
  EXPECT_EQ(final_weights(resumed.output), expected) << resumed.output;
}

TEST(LaunchUsage, BadUsageExitsWithTwoAndSaysWhy) {
  const std::string probe = bin("launch_probe");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc-per-node", "2"}, "launch: no program to run. Put it after --"},
      {{"--nproc-per-node", "0", "--", probe, "env"}, "--nproc-per-node must be at least 1, not 0"},
      {{"--nproc-per-node", "5000", "--", probe, "env"}, "--nproc-per-node 5000 is more than 1024 workers"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "--token", "t", "--", probe, "env"},
       "--node-rank 2 is outside [0, 2)"},
      {{"--nnodes", "2", "--token", "t", "--", probe, "env"}, "--nnodes 2 needs --master-port"},
      {{"--nnodes", "2", "--master-port", "29500", "--", probe, "env"}, "needs the same store token on every node"},
      {{"--", "no_such_program_datapar"}, "program \"no_such_program_datapar\" is not found on PATH"},
      {{"--no-such-flag", "--", probe, "env"}, "--no-such-flag"},
      // Issue 46: it was "The following arguments were not expected: <the program's>".
      {{"--runner", "fork", "--", probe, "env"}, "datapar launch: unknown option --runner (before --"},
      {{"--runner=fork", "--nproc-per-node", "2", "--", probe, "env"}, "unknown option --runner (before --"},
      {{"--min-ranks", "2", "--", probe, "env"}, "--min-ranks and --max-ranks are for a fault-tolerant job"},
      {{"--fault-tolerant", "--nproc-per-node", "3", "--min-ranks", "5", "--", probe, "env"},
       "--min-ranks 5 must be in [1, 3]"},
      {{"--fault-tolerant", "--ft-timeout", "0.01", "--", probe, "env"}, "--ft-timeout 0.01: give seconds"},
      {{"--fault-tolerant", "--nnodes", "2", "--master-port", "29500", "--token", "t", "--min-ranks", "3", "--",
        probe, "env"},
       "--min-ranks 3 must be in [1, 2]"},
  };
  ::unsetenv("DATAPAR_STORE_TOKEN");
  for (const auto& [args, message] : cases) {
    const ProcessResult r = launch(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}

// A network partition (the link between the two hosts goes down: every packet is lost, no
// connection is reset) during a collective: each rank fails with an error naming the rank it
// cannot reach, within the group's timeout (5 s) plus slack, instead of hanging.
TEST(TwoHosts, PartitionFailsBothRanksNamingThePeerWithinTheTimeout) {
  const std::string skip = datapar::testing::namespace_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  datapar::testing::NamespacePair hosts;
  ASSERT_TRUE(hosts.ok()) << "could not set up the namespaces:\n" << hosts.setup_output();
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  auto rank = [&](const std::string& ns, const std::string& address, int r) {
    return "ip netns exec " + ns + " env RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=" +
           hosts.address_a() + " MASTER_PORT=29500 DATAPAR_STORE_TOKEN=partition DATAPAR_GLOO_HOSTNAME=" + address +
           " timeout 60 " + bin("launch_probe") + " partition " + dir + " > " + dir + "/" + std::to_string(r) +
           ".log 2>&1; echo $? > " + dir + "/" + std::to_string(r) + ".exit";
  };
  const std::string command = "(" + rank(hosts.b(), hosts.address_b(), 1) + ") & (" +
                              rank(hosts.a(), hosts.address_a(), 0) + ") & wait";
  std::thread job([&] {
    datapar::testing::run_shell("sh -c '" + command + "'");
  });
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline &&
         !(datapar::detail::exists(dir + "/ready-0") && datapar::detail::exists(dir + "/ready-1"))) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(datapar::detail::exists(dir + "/ready-0") && datapar::detail::exists(dir + "/ready-1"))
      << read_text(dir + "/0.log") << read_text(dir + "/1.log");
  const ProcessResult cut = datapar::testing::run_shell(
      "ip -n " + hosts.a() + " link set dev $(ip -n " + hosts.a() + " -o link show type veth | cut -d: -f2 | cut -d@ -f1) down");
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  std::ofstream(dir + "/partitioned") << "now\n";
  job.join();
  for (int r : {0, 1}) {
    const std::string log = read_text(dir + "/" + std::to_string(r) + ".log");
    EXPECT_EQ(read_text(dir + "/" + std::to_string(r) + ".exit"), "1\n") << "rank " << r << ":\n" << log;
    std::string lower = log;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    EXPECT_NE(lower.find("rank " + std::to_string(1 - r)), std::string::npos)
        << "rank " << r << "'s error does not name rank " << 1 - r << ":\n" << log;
    std::smatch waited;
    ASSERT_TRUE(std::regex_search(log, waited, std::regex("after ([0-9.]+) s"))) << log;
    EXPECT_LT(std::stod(waited[1]), 5 + 10) << "rank " << r << " took too long to fail:\n" << log;
  }
}

// One launcher per "host" (network namespace), two workers each: the four ranks form one
// Gloo group across the veth link and all-reduce their ranks: 0 + 1 + 2 + 3 = 6.
TEST(TwoHosts, LaunchAcrossANetworkNamespacePair) {
  const std::string skip = datapar::testing::namespace_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  datapar::testing::NamespacePair hosts;
  ASSERT_TRUE(hosts.ok()) << "could not set up the namespaces:\n" << hosts.setup_output();
  const TempDir temp("launch_test");
  const std::string& dir = temp.path();
  auto node = [&](const std::string& ns, const std::string& address, int node_rank) {
    // Both namespaces share this machine's hostname: tell Gloo which address is ours.
    return "ip netns exec " + ns + " env DATAPAR_GLOO_HOSTNAME=" + address + " timeout 60 " + bin("datapar") +
           " launch --nproc-per-node 2 --nnodes 2 --node-rank " + std::to_string(node_rank) + " --master-addr " +
           hosts.address_a() + " --master-port 29500 --token twohosts -- " + bin("launch_probe") + " allreduce";
  };
  // Node 1 starts first: its workers retry until node 0's store is up.
  const std::string command = node(hosts.b(), hosts.address_b(), 1) + " > " + dir + "/b.log 2>&1 & b=$!; sleep 0.2; " +
                              node(hosts.a(), hosts.address_a(), 0) + " > " + dir + "/a.log 2>&1; a=$?; wait $b; " +
                              "echo \"exit codes $a $?\"";
  const std::string output = datapar::testing::run_shell("sh -c '" + command + "'").output;
  const std::string a = read_text(dir + "/a.log"), b = read_text(dir + "/b.log");
  EXPECT_NE(output.find("exit codes 0 0"), std::string::npos) << output << "\nnode 0:\n" << a << "\nnode 1:\n" << b;
  for (int rank : {0, 1}) {
    EXPECT_NE(a.find("[rank " + std::to_string(rank) + "] sum 6 over 4 ranks"), std::string::npos) << a;
  }
  for (int rank : {2, 3}) {
    EXPECT_NE(b.find("[rank " + std::to_string(rank) + "] sum 6 over 4 ranks"), std::string::npos) << b;
  }
  // Two processes per "host": all_reduce in two levels (shared memory within each namespace,
  // Gloo between their leaders), exact.
  for (const std::string* log : {&a, &b}) {
    EXPECT_EQ(count(*log, "large all_reduce exact via all_reduce(sum) on rank "), 2) << *log;
    EXPECT_EQ(count(*log, "(gloo, two levels)"), 2) << *log;
  }
}

// A fault-tolerant job on two hosts, one worker each: the worker of node 1 is SIGKILLed
// after the first epoch; node 1's launcher restarts it alone, it joins node 0's worker,
// which trained on meanwhile, and the job ends as one that was never interrupted. Node 0
// serves the store until node 1 reported that it is done.
TEST(TwoHosts, AFaultTolerantJobRestartsAWorkerOnItsOwnNodeAndEndsAsAnUninterruptedOne) {
  const std::string skip = datapar::testing::namespace_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  // The replacement (Torch loaded anew) must join before node 0's worker has trained the
  // rest alone: 3 epochs left it about a second, which a loaded machine exceeded once.
  constexpr int kEpochs = 5;
  auto train = [](const std::string& checkpoints) {
    return std::vector<std::string>{bin("datapar"), "train", "--fault-tolerant", "--mode", "ddp", "--backend", "gloo",
                                    "--model", "lenet", "--epochs", std::to_string(kEpochs), "--batch-size", "48",
                                    "--limit", "2000", "--threads", "1", "--workers", "1", "--momentum", "0.9",
                                    "--checkpoint-dir", checkpoints};
  };
  // The uninterrupted run: the same job size (2) on one node.
  const TempDir straight_dir("launch_test");
  std::vector<std::string> straight_args = {"--fault-tolerant", "--nproc-per-node", "2", "--"};
  for (const std::string& a : train(straight_dir.path())) straight_args.push_back(a);
  const ProcessResult straight = launch(straight_args);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  datapar::testing::NamespacePair hosts;
  ASSERT_TRUE(hosts.ok()) << "could not set up the namespaces:\n" << hosts.setup_output();
  const TempDir killed_dir("launch_test"), logs("launch_test");
  auto node = [&](const std::string& ns, const std::string& address, int node_rank) {
    std::vector<std::string> command = {"ip", "netns", "exec", ns, "env", "DATAPAR_GLOO_HOSTNAME=" + address,
                                        bin("datapar"), "launch", "--fault-tolerant", "--nproc-per-node", "1",
                                        "--nnodes", "2", "--node-rank", std::to_string(node_rank), "--master-addr",
                                        hosts.address_a(), "--master-port", "29501", "--token", "twohosts",
                                        "--max-restarts", "1", "--"};
    for (const std::string& a : train(killed_dir.path())) command.push_back(a);
    return datapar::testing::start_logged(command, logs.path() + "/node" + std::to_string(node_rank) + ".log");
  };
  const pid_t b = node(hosts.b(), hosts.address_b(), 1);
  const pid_t a = node(hosts.a(), hosts.address_a(), 0);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  const std::string log_a = logs.path() + "/node0.log", log_b = logs.path() + "/node1.log";
  std::map<int, pid_t> workers;
  for (const auto deadline = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(5ms)) {
    workers = workers_of(b, 0);
    if (workers.count(1) == 1 && latest_epoch(killed_dir.path()) >= 1) break;
  }
  ASSERT_EQ(workers.count(1), 1u) << read_text(log_b);
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);
  EXPECT_EQ(wait_exit(a, 120s), 0) << read_text(log_a) << "\nnode 1:\n" << read_text(log_b);
  EXPECT_EQ(wait_exit(b, 30s), 0) << read_text(log_b);
  const std::string said_a = read_text(log_a), said_b = read_text(log_b);
  EXPECT_NE(said_b.find("restarting it alone (restart 1 of 1); the other workers go on"), std::string::npos) << said_b;
  EXPECT_EQ(said_a.find("restarting"), std::string::npos) << said_a;
  // Node 0's worker kept rank 0 and reported every epoch; the last one with both ranks.
  const size_t last = said_a.find("epoch " + std::to_string(kEpochs) + "/" + std::to_string(kEpochs));
  ASSERT_NE(last, std::string::npos) << said_a;
  EXPECT_NE(said_a.substr(last).find("2 ranks"), std::string::npos) << said_a;
  expect_same_model(train::checkpoint_path(straight_dir.path(), kEpochs),
                    train::checkpoint_path(killed_dir.path(), kEpochs));
}

// Issue 46: --metrics and --plot under --fault-tolerant (they were ignored: exit 0, no file).
// The reporter is each epoch's rank 0; here the first one is SIGKILLed after epoch 1, and
// the member that reports the next epochs takes the earlier ones from the file.
TEST(LaunchFaultTolerant, MetricsAndPlotCoverEveryEpochWhenTheReporterDies) {
  const TempDir dir("launch_test"), logs("launch_test");
  const bool plot = !datapar::train::find_gnuplot().empty();
  std::vector<std::string> args{"--fault-tolerant", "--nproc-per-node", "3", "--ft-timeout", "1", "--max-restarts",
                                "1", "--", bin("datapar"), "train", "--fault-tolerant", "--mode", "ddp", "--backend",
                                "gloo", "--model", "mlp", "--batch-size", "48", "--limit", "2400", "--threads", "1",
                                "--workers", "1", "--epochs", "3", "--metrics", dir.path() + "/m.jsonl"};
  if (plot) {
    args.push_back("--plot");
    args.push_back(dir.path() + "/p.png");
  }
  const Background b = start_launch(args, logs.path());
  ASSERT_GT(b.pid, 0);
  // The reporter of epoch 1: the rank whose line says so ("[rank N] epoch 1/3").
  static const std::regex first_line("\\[rank (\\d+)\\] epoch 1/3");
  std::smatch m;
  std::string log;
  for (const auto deadline = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < deadline && !std::regex_search(log, m, first_line);
       std::this_thread::sleep_for(2ms)) {
    log = read_text(b.log);
  }
  ASSERT_TRUE(std::regex_search(log, m, first_line)) << log;
  const int reporter = std::stoi(m[1]);
  const std::map<int, pid_t> workers = workers_of(b.pid, 0);
  ASSERT_EQ(workers.count(reporter), 1u) << log;
  ASSERT_EQ(::kill(workers.at(reporter), SIGKILL), 0);
  EXPECT_EQ(wait_exit(b.pid, 120s), 0) << read_text(b.log);
  std::ifstream in(dir.path() + "/m.jsonl");
  std::vector<datapar::train::EpochMetrics> epochs;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) epochs.push_back(datapar::train::from_json(line));
  }
  ASSERT_EQ(epochs.size(), 3u) << read_text(dir.path() + "/m.jsonl") << read_text(b.log);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(epochs[e].epoch, e + 1);
    EXPECT_EQ(epochs[e].test_samples, 1000);
    EXPECT_GT(epochs[e].test_accuracy, 0.3);
    EXPECT_EQ(epochs[e].mode, "ddp");
  }
  // The rows the members alive at an epoch's end trained in it: all 2400 undisturbed
  // (FaultTolerantOnRealData's job), fewer when a member died with its share.
  for (const auto& e : epochs) {
    EXPECT_GT(e.train_samples, 0);
    EXPECT_LE(e.train_samples, 2400);
  }
  if (plot) {
    std::ifstream png(dir.path() + "/p.png", std::ios::binary);
    char magic[8] = {};
    png.read(magic, 8);
    EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  }
}

// Issue 46: a launcher and a program that disagree on --fault-tolerant stop at once with the
// reason (rank 0 of a program without it failed to serve the launcher's port, and the others
// waited for it past 60 s).
TEST(LaunchFaultTolerant, ALauncherAndAProgramThatDisagreeOnFaultToleranceStopAtOnce) {
  const std::vector<std::string> program{bin("datapar"), "train", "--mode", "ddp", "--model", "mlp", "--epochs", "1",
                                         "--limit", "200", "--threads", "1", "--workers", "1"};
  std::vector<std::string> tolerant_launcher{"--fault-tolerant", "--nproc-per-node", "2", "--"};
  tolerant_launcher.insert(tolerant_launcher.end(), program.begin(), program.end());
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult a = launch(tolerant_launcher);
  EXPECT_EQ(a.exit_code, 2) << a.output;
  EXPECT_NE(a.output.find("datapar launch --fault-tolerant runs this program, but it was not given --fault-tolerant"),
            std::string::npos)
      << a.output;
  std::vector<std::string> plain_launcher{"--nproc-per-node", "2", "--"};
  plain_launcher.insert(plain_launcher.end(), program.begin(), program.end());
  plain_launcher.push_back("--fault-tolerant");
  const ProcessResult b = launch(plain_launcher);
  EXPECT_EQ(b.exit_code, 2) << b.output;
  EXPECT_NE(b.output.find("--fault-tolerant needs a launcher that serves the job's store"), std::string::npos)
      << b.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

// Issue 46: nodes whose `datapar train` flags differ would mix two trainings (another
// --batch-size hung both nodes; another --seed trained to exit 0 with another model). The
// worker that joins second is refused at once, naming each flag with both values.
TEST(LaunchFaultTolerant, AWorkerWhoseTrainingDiffersIsRefusedNamingTheFlags) {
  const datapar::ReservedPort port;
  const TempDir logs0("launch_test"), logs1("launch_test");
  auto node = [&](int node_rank, const std::string& logs, const std::vector<std::string>& own) {
    std::vector<std::string> args{"--fault-tolerant", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank",
                                  std::to_string(node_rank), "--master-port", std::to_string(port.port()), "--token",
                                  "differ", "--", bin("datapar"), "train", "--fault-tolerant", "--mode", "ddp",
                                  "--model", "mlp", "--epochs", "2", "--limit", "960", "--threads", "1", "--workers",
                                  "1"};
    args.insert(args.end(), own.begin(), own.end());
    return start_launch(args, logs);
  };
  const Background zero = node(0, logs0.path(), {"--batch-size", "48"});
  const Background one = node(1, logs1.path(), {"--batch-size", "64", "--seed", "3"});
  ASSERT_GT(zero.pid, 0);
  ASSERT_GT(one.pid, 0);
  // Whichever worker joins second is refused at once (the other waits for the quorum, and
  // node 0's launcher serves the store for it: both launchers are stopped then).
  const std::string said = "this worker's training differs from the job's (the first worker's): ";
  int refused = -1;
  for (const auto deadline = std::chrono::steady_clock::now() + 30s;
       refused < 0 && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    if (read_text(zero.log).find(said) != std::string::npos) refused = 0;
    if (read_text(one.log).find(said) != std::string::npos) refused = 1;
  }
  // Its launcher reports the usage error (exit 2).
  for (const auto deadline = std::chrono::steady_clock::now() + 10s;
       refused >= 0 && std::chrono::steady_clock::now() < deadline &&
       read_text(refused == 0 ? zero.log : one.log).find("exited with code 2") == std::string::npos;
       std::this_thread::sleep_for(20ms)) {
  }
  ::kill(zero.pid, SIGTERM);
  ::kill(one.pid, SIGTERM);
  wait_exit(zero.pid, 30s);
  wait_exit(one.pid, 30s);
  ASSERT_GE(refused, 0) << "no worker was refused:\n" << read_text(zero.log) << "\nnode 1:\n" << read_text(one.log);
  const std::string log = read_text(refused == 0 ? zero.log : one.log);
  const std::string mine = refused == 0 ? "48" : "64", theirs = refused == 0 ? "64" : "48";
  EXPECT_NE(log.find("--batch-size (after --scale-lr) is " + mine + " here, " + theirs + " there"), std::string::npos)
      << log;
  EXPECT_NE(log.find("--seed is"), std::string::npos) << log;
  EXPECT_NE(log.find("exited with code 2"), std::string::npos) << log;
}

// Issue 46: fault tolerance promises the model of an undisturbed run, whoever dies or hangs,
// so it is checked where it can fail: an MLP with momentum on the shipped Fashion-MNIST
// subset, every epoch's checkpoint (model and momentum) against an undisturbed job's. On
// this data the last bits matter: when a 2-rank stretch summed the batches in another order,
// a recovery right after the first epoch ended 3e-3 off at epoch 3 (5e-2 by epoch 5, exit
// 0), and 6e-8 off every time. The gradients are now the same whoever is alive (Note
// [Gradients that do not depend on who is alive]), so the checkpoints are equal to the bit
// (the issue asks 1e-5; anything but equal is a sign of the drift). GetParam(): "ddp", "zero" (--zero:
// the momentum sharded, each shard kept twice) or "fsdp" (the parameters sharded too); the
// undisturbed job is plain ddp.
class FaultTolerantOnRealData : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int kEpochs = 4;

  // `launcher`: flags of datapar launch before the program's.
  static std::vector<std::string> job(const std::string& checkpoints, const std::string& mode,
                                      std::vector<std::string> launcher, bool resume = false) {
    std::vector<std::string> args{"--fault-tolerant", "--nproc-per-node", "3", "--ft-timeout", "1"};
    args.insert(args.end(), launcher.begin(), launcher.end());
    const std::vector<std::string> program{
        "--",          bin("datapar"), "train",    "--fault-tolerant", "--mode", mode == "fsdp" ? "fsdp" : "ddp",
        "--backend",   "gloo",
        "--model",     "mlp",          "--batch-size", "48",           "--limit", "2400", "--lr",     "0.02",
        "--momentum",  "0.9",          "--threads", "1",               "--workers", "1",  "--epochs"};
    args.insert(args.end(), program.begin(), program.end());
    args.push_back(std::to_string(kEpochs));
    args.push_back("--checkpoint-dir");
    args.push_back(checkpoints);
    if (mode == "zero") args.push_back("--zero");
    if (resume) args.push_back("--resume");
    return args;
  }

  static void SetUpTestSuite() {
    undisturbed_ = new TempDir("launch_test");
    std::vector<std::string> args = job(undisturbed_->path(), "ddp", {});
    const std::string metrics = undisturbed_->path() + "/m.jsonl";
    args.insert(args.end(), {"--metrics", metrics});
    const ProcessResult r = launch(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // --metrics under --fault-tolerant: every epoch, every row of it.
    std::ifstream in(metrics);
    int epochs = 0;
    for (std::string line; std::getline(in, line); ++epochs) {
      const datapar::train::EpochMetrics m = datapar::train::from_json(line);
      EXPECT_EQ(m.epoch, epochs + 1);
      EXPECT_EQ(m.train_samples, 2400);
    }
    EXPECT_EQ(epochs, kEpochs) << read_text(metrics);
  }
  static void TearDownTestSuite() {
    delete undisturbed_;
    undisturbed_ = nullptr;
  }

  // Starts the job in `dir` and returns its launcher and workers once the first epoch's
  // checkpoint is written.
  static std::pair<Background, std::map<int, pid_t>> start_until_first_epoch(const TempDir& dir, const TempDir& logs,
                                                                              std::vector<std::string> launcher) {
    const Background b = start_launch(job(dir.path(), GetParam(), std::move(launcher)), logs.path());
    std::map<int, pid_t> workers;
    for (const auto deadline = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(2ms)) {
      workers = workers_of(b.pid, 0);
      if (workers.size() == 3 && latest_epoch(dir.path()) >= 1) break;
    }
    return {b, workers};
  }

  // Every epoch's checkpoint in `dir` is the undisturbed job's.
  static void expect_every_epoch_undisturbed(const std::string& dir) {
    for (int epoch = 1; epoch <= kEpochs; ++epoch) {
      SCOPED_TRACE("epoch " + std::to_string(epoch));
      expect_same_model(train::checkpoint_path(undisturbed_->path(), epoch), train::checkpoint_path(dir, epoch),
                        /*tolerance=*/0.0);
    }
  }

  static TempDir* undisturbed_;
};

TempDir* FaultTolerantOnRealData::undisturbed_ = nullptr;

// One member SIGSTOPped past the timeout: the others go on as two, it comes back, is told it
// was evicted and rejoins.
TEST_P(FaultTolerantOnRealData, AStoppedMemberLeavesTheModelAsAnUndisturbedRun) {
  const TempDir dir("launch_test"), logs("launch_test");
  const auto [b, workers] = start_until_first_epoch(dir, logs, {});
  ASSERT_EQ(workers.size(), 3u) << read_text(b.log);
  ASSERT_EQ(::kill(workers.at(1), SIGSTOP), 0);
  std::this_thread::sleep_for(2500ms);
  ::kill(workers.at(1), SIGCONT);
  EXPECT_EQ(wait_exit(b.pid, 120s), 0) << read_text(b.log);
  EXPECT_NE(read_text(b.log).find(": 2 ranks, training from step"), std::string::npos) << read_text(b.log);
  expect_every_epoch_undisturbed(dir.path());
}

// A forged membership epoch (whoever can reach the store: the job's token is in every
// worker's environment): the next epoch written with two of the three members, the current
// one marked broken. Their collectives abort, two form an epoch without the third while the
// decider forms its own; whatever mix of epochs follows, the model is the undisturbed one.
TEST_P(FaultTolerantOnRealData, AForgedMembershipEpochLeavesTheModelAsAnUndisturbedRun) {
  const TempDir dir("launch_test"), logs("launch_test");
  const auto [b, workers] = start_until_first_epoch(dir, logs, {});
  ASSERT_EQ(workers.size(), 3u) << read_text(b.log);
  std::string environment = read_text("/proc/" + std::to_string(workers.at(0)) + "/environ");
  std::replace(environment.begin(), environment.end(), '\0', '\n');
  const auto variable = [&](const std::string& name) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(environment, m, std::regex("(^|\n)" + name + "=([^\n]*)"))) << name;
    return m.size() > 2 ? m[2].str() : std::string();
  };
  auto client = std::make_shared<datapar::TcpStore>(
      datapar::TcpStoreOptions{variable("MASTER_ADDR"), static_cast<uint16_t>(std::stoi(variable("MASTER_PORT"))),
                               false, variable("DATAPAR_STORE_TOKEN"), 10s, variable("DATAPAR_RUN_ID")});
  datapar::PrefixStore store("ft/job/", client);
  const int64_t current = std::stoll(datapar::as_text(store.get("epoch")));
  datapar::ft::Membership forged = datapar::ft::Membership::decode(current, datapar::as_text(store.get("epoch/" +
                                                                                       std::to_string(current))));
  ASSERT_EQ(forged.size(), 3);
  forged.members.pop_back();
  const std::string record = forged.encode(), reason = "forged";
  store.set("epoch/" + std::to_string(current + 1), datapar::Bytes(record.begin(), record.end()));
  store.set("broken/" + std::to_string(current), datapar::Bytes(reason.begin(), reason.end()));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_exit(b.pid, 120s), 0) << read_text(b.log);
  const std::string log = read_text(b.log);
  // The decider finds the record it did not write, marks it broken and goes on after it:
  // no member is left waiting for an epoch that never comes (it used to wait 60 s and fail).
  EXPECT_NE(log.find("was not written by the decider"), std::string::npos) << log;
  EXPECT_EQ(log.find("exited with code"), std::string::npos) << log;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 40s) << log;
  expect_every_epoch_undisturbed(dir.path());
}

// Two members SIGKILLed together. ddp: the survivor trains every slice alone until the
// replacements join. zero, fsdp: the two kept a shard of the momentum (and under fsdp of the
// parameters) between them, so the job stops with that reason, and --resume goes on from
// the last checkpoint.
TEST_P(FaultTolerantOnRealData, TwoMembersKilledTogetherLeaveTheModelAsAnUndisturbedRun) {
  const std::string mode = GetParam();
  const TempDir dir("launch_test"), logs("launch_test");
  const auto [b, workers] = start_until_first_epoch(dir, logs, {"--max-restarts", "1"});
  ASSERT_EQ(workers.size(), 3u) << read_text(b.log);
  ASSERT_EQ(::kill(workers.at(1), SIGKILL), 0);
  ASSERT_EQ(::kill(workers.at(2), SIGKILL), 0);
  const int exit_code = wait_exit(b.pid, 120s);
  const std::string log = read_text(b.log);
  EXPECT_NE(log.find("rank 1 (local rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 2 (local rank 2"), std::string::npos) << log;
  if (mode != "ddp") {
    EXPECT_NE(exit_code, 0) << log;
    EXPECT_NE(log.find(mode == "zero" ? "both members that kept it left the job at once"
                                      : "a rank and the next one left the job at once"),
              std::string::npos)
        << log;
    const ProcessResult resumed = launch(job(dir.path(), mode, {}, /*resume=*/true));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  } else {
    EXPECT_EQ(exit_code, 0) << log;
  }
  expect_every_epoch_undisturbed(dir.path());
}

// The whole job stopped (its launcher SIGTERMed in the second epoch) and started again with
// --resume: it goes on from the last checkpoint.
TEST_P(FaultTolerantOnRealData, AStoppedJobResumesAsAnUndisturbedRun) {
  const TempDir dir("launch_test"), logs("launch_test");
  {
    const auto [b, workers] = start_until_first_epoch(dir, logs, {});
    ASSERT_EQ(workers.size(), 3u) << read_text(b.log);
    ASSERT_EQ(::kill(b.pid, SIGTERM), 0);
    EXPECT_NE(wait_exit(b.pid, 60s), 0) << read_text(b.log);
  }
  ASSERT_LT(latest_epoch(dir.path()), kEpochs) << "the job did not stop";
  const ProcessResult resumed = launch(job(dir.path(), GetParam(), {}, /*resume=*/true));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  expect_every_epoch_undisturbed(dir.path());
}

INSTANTIATE_TEST_SUITE_P(Modes, FaultTolerantOnRealData, ::testing::Values("ddp", "zero", "fsdp"));

}  // namespace
