// remove_stale_entries: what a SIGKILLed process left under its pid goes; what a live one
// holds stays.
#include "stale_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "child_process.h"
#include "testing/temp_dir.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)

namespace datapar::detail {
namespace {

// The pid of a process that has ended (and was reaped), so no process has it now.
pid_t dead_pid() {
  const pid_t pid = fork_child([] { return 0; });
  wait_child(pid);
  return pid;
}

TEST(StaleFiles, RemovesEntriesOfDeadProcessesOnly) {
  const testing::TempDir temp("stale_files");
  const std::string dir = temp.path() + "/";
  const std::string dead = std::to_string(dead_pid());
  const std::string live = std::to_string(::getpid());
  make_directories(dir + ("datapar-launch-" + dead + "-abc/inner"));
  std::ofstream(dir + ("datapar-launch-" + dead + "-abc/inner/file")) << "x";
  std::ofstream(dir + ("datapar-shm-" + dead + "-0123")) << "region";
  make_directories(dir + ("datapar-launch-" + live + "-def"));
  make_directories(dir + "datapar-launch-notapid-x");
  make_directories(dir + ("other-" + dead + "-x"));

  EXPECT_EQ(remove_stale_entries(dir, "datapar-launch-"), 1);
  EXPECT_EQ(remove_stale_entries(dir, "datapar-shm-"), 1);
  EXPECT_FALSE(exists(dir + ("datapar-launch-" + dead + "-abc")));
  EXPECT_FALSE(exists(dir + ("datapar-shm-" + dead + "-0123")));
  EXPECT_TRUE(exists(dir + ("datapar-launch-" + live + "-def")));
  EXPECT_TRUE(exists(dir + "datapar-launch-notapid-x"));
  EXPECT_TRUE(exists(dir + ("other-" + dead + "-x")));
  EXPECT_EQ(remove_stale_entries(dir + "missing", "datapar-"), 0);
}

}  // namespace
}  // namespace datapar::detail
