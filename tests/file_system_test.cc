// src/file_system.h: the POSIX stand-ins for the std::filesystem calls datapar used.
#include "file_system.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/temp_dir.h"

namespace datapar::detail {
namespace {

TEST(FileSystem, ParentDirectoryAsStdFilesystem) {
  EXPECT_EQ(parent_directory("a/b"), "a");
  EXPECT_EQ(parent_directory("a/b/"), "a");
  EXPECT_EQ(parent_directory("/x"), "/");
  EXPECT_EQ(parent_directory("x"), "");
  EXPECT_EQ(parent_directory("/tmp/run/metrics.jsonl"), "/tmp/run");
  EXPECT_EQ(parent_directory("a//b"), "a");
  EXPECT_EQ(parent_directory("/"), "/");
}

// Ranks make a checkpoint's directory at the same moment: whoever comes second must not
// report the first one's directory as "not a directory" (dcp::save did, 1 run in 3).
TEST(FileSystem, MakeDirectoriesRacingWithItselfSucceedsEverywhere) {
  const testing::TempDir dir("fs");
  for (int round = 0; round < 200; ++round) {
    const std::string path = dir.path() + "/" + std::to_string(round) + "/a/b";
    std::vector<std::string> problems(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { problems[t] = make_directories(path); });
    for (std::thread& t : threads) t.join();
    for (const std::string& p : problems) ASSERT_EQ(p, "") << "round " << round;
  }
}

TEST(FileSystem, MakeDirectoriesMakesParentsAndSaysWhatFailed) {
  const testing::TempDir temp("file_system");
  EXPECT_EQ(make_directories(temp.path() + "/a/b/c"), "");
  EXPECT_TRUE(is_directory(temp.path() + "/a/b/c"));
  EXPECT_EQ(make_directories(temp.path() + "/a/b/c"), "");  // there already
  std::ofstream(temp.path() + "/file") << "x";
  const std::string problem = make_directories(temp.path() + "/file/sub");
  EXPECT_NE(problem.find(temp.path() + "/file: exists and is not a directory"), std::string::npos) << problem;
  EXPECT_FALSE(is_directory(temp.path() + "/file"));
}

TEST(FileSystem, RemoveTreeRemovesEverythingButFollowsNoLink) {
  const testing::TempDir temp("file_system");
  const std::string kept = temp.path() + "/kept", tree = temp.path() + "/tree";
  ASSERT_EQ(make_directories(kept), "");
  std::ofstream(kept + "/precious") << "x";
  ASSERT_EQ(make_directories(tree + "/inner/deeper"), "");
  std::ofstream(tree + "/inner/deeper/file") << "x";
  ASSERT_EQ(::symlink(kept.c_str(), (tree + "/link").c_str()), 0);
  EXPECT_EQ(remove_tree(tree), 5);  // file, deeper, inner, link, tree
  EXPECT_FALSE(exists(tree));
  EXPECT_TRUE(exists(kept + "/precious"));
  EXPECT_EQ(remove_tree(tree), 0);
}

TEST(FileSystem, ListDirectoryNamesEntriesButDots) {
  const testing::TempDir temp("file_system");
  std::ofstream(temp.path() + "/one") << "1";
  ASSERT_EQ(make_directories(temp.path() + "/two"), "");
  std::vector<std::string> names = list_directory(temp.path());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"one", "two"}));
  EXPECT_TRUE(list_directory(temp.path() + "/missing").empty());
}

}  // namespace
}  // namespace datapar::detail
