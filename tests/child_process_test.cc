// The one unit that starts programs and waits for processes (src/child_process.h): PATH
// lookup, exec failures said on the child's stderr, deadlines that take the whole process
// group down, forked ranks' exit codes.
#include "child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(ChildProcess, FindsExecutablesOnPathAndInTheDirectoriesGiven) {
  EXPECT_NE(find_executable("sh"), "");
  EXPECT_EQ(find_executable("no_such_program_datapar"), "");
  EXPECT_EQ(find_executable("/etc/passwd"), "") << "not executable";
  const testing::TempDir dir("child_process");
  const std::string tool = dir.path() + "/tool";
  std::ofstream(tool) << "#!/bin/sh\nexit 3\n";
  ::chmod(tool.c_str(), 0755);
  EXPECT_EQ(find_executable("tool"), "");
  EXPECT_EQ(find_executable("tool", {dir.path()}), tool);
  EXPECT_NE(this_program().find("datapar_tests"), std::string::npos) << this_program();
}

TEST(ChildProcess, ExitCodesAndExecFailuresComeBack) {
  const testing::TempDir dir("child_process");
  const std::string log = dir.path() + "/log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ChildOptions options;
  options.stdout_fd = fd;
  options.stderr_fd = fd;
  options.who = "child_process_test";
  EXPECT_EQ(wait_child(start_child({"sh", "-c", "echo out; echo err >&2; exit 7"}, options)).exit_code, 7);
  EXPECT_EQ(wait_child(start_child({"no_such_program_datapar"}, options)).exit_code, 127);
  ::close(fd);
  const std::string text = testing::read_text(log);
  EXPECT_NE(text.find("out\nerr\n"), std::string::npos) << text;
  EXPECT_NE(text.find("child_process_test: cannot run no_such_program_datapar: not an executable file on PATH"),
            std::string::npos)
      << text;
  options.environment = std::vector<std::string>{"ONLY=this"};
  options.stdout_fd = options.stderr_fd = -1;
  EXPECT_EQ(wait_child(start_child({"/bin/sh", "-c", "test \"$ONLY\" = this && test -z \"$HOME\""}, options)).exit_code, 0);
}

// Past the deadline the child and everything it started (its process group) are killed.
TEST(ChildProcess, ADeadlineEndsTheWholeGroup) {
  const testing::TempDir dir("child_process");
  const std::string pid_file = dir.path() + "/grandchild";
  const auto start = Clock::now();
  const pid_t pid = start_child({"sh", "-c", "sleep 60 & echo $! > " + pid_file + "; wait"});
  ASSERT_GT(pid, 0);
  while (testing::read_text(pid_file).empty() && Clock::now() - start < 10s) std::this_thread::sleep_for(10ms);
  const pid_t grandchild = std::stoi(testing::read_text(pid_file));
  const ChildExit exit = wait_child(pid, Clock::now() + 200ms);
  EXPECT_TRUE(exit.timed_out);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_LT(Clock::now() - start, 30s);
  // Gone, or a zombie left for whoever adopted it to reap.
  auto dead = [](pid_t p) {
    const std::string stat = testing::read_text("/proc/" + std::to_string(p) + "/stat");
    const size_t paren = stat.rfind(')');
    return stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() &&
                            (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X'));
  };
  bool gone = false;
  for (int i = 0; i < 200 && !(gone = dead(grandchild)); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(gone) << "the grandchild " << grandchild << " outlived the deadline";
  if (!gone) ::kill(grandchild, SIGKILL);
}

TEST(ChildProcess, ForkedRanksReturnTheirCodesAndSayWhatTheyThrew) {
  const auto exits = fork_ranks(
      3,
      [](int rank) {
        if (rank == 2) throw std::runtime_error("rank two failed");
        return rank * 10;
      },
      "child_process_test");
  ASSERT_EQ(exits.size(), 3u);
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_TRUE(exits[0].succeeded());
  EXPECT_EQ(exits[1].exit_code, 10);
  EXPECT_EQ(exits[2].exit_code, 1);
}

// Output the forking process had not flushed yet is its own: a forked child does not write
// it a second time when it exits.
TEST(ChildProcess, AForkedChildDoesNotRepeatItsParentsUnflushedOutput) {
  const testing::TempDir dir("child_process_test");
  const std::string path = dir.path() + "/out.txt";
  const pid_t parent = fork_child([&] {
    if (std::freopen(path.c_str(), "w", stdout) == nullptr) return 2;
    std::printf("said once;");  // a file's stdout is fully buffered: still in the buffer
    const pid_t child = fork_child([] { return 0; });
    return child > 0 && wait_child(child).exit_code == 0 ? 0 : 3;
  });
  ASSERT_GT(parent, 0);
  EXPECT_EQ(wait_child(parent).exit_code, 0);
  EXPECT_EQ(testing::read_text(path), "said once;");
}

}  // namespace
}  // namespace datapar::detail
