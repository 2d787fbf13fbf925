#include "datapar/rendezvous/file_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>

#include "child_process.h"
#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar {
namespace {

using datapar::testing::read_text;
using namespace std::chrono_literals;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

FileStoreOptions world(int size, std::chrono::milliseconds timeout = 10s) { return {size, "run-a", timeout}; }

// Runs fn in `count` child processes (fn gets the child's index); returns how many exited 0.
int run_processes(int count, const std::function<int(int)>& fn) {
  int ok = 0;
  for (const detail::ChildExit& e : detail::fork_ranks(count, fn, "file_store_test")) ok += e.succeeded();
  return ok;
}

TEST(FileStore, EveryOperation) {
  const testing::TempDir dir("file_store");
  const std::string path = dir.path() + "/store";
  {
    FileStore store(path, world(1));
    store.set("a", "1");
    EXPECT_EQ(store.get_string("a"), "1");
    EXPECT_EQ(store.add("n", 5), 5);
    EXPECT_EQ(store.add("n", -1), 4);
    EXPECT_EQ(store.compare_set("c", {}, Bytes{1}), Bytes{1});
    EXPECT_EQ(store.compare_set("c", Bytes{9}, Bytes{2}), Bytes{1});
    EXPECT_EQ(store.compare_set("c", Bytes{1}, Bytes{2}), Bytes{2});
    EXPECT_TRUE(store.check({"a", "n", "c"}));
    EXPECT_EQ(store.num_keys(), 3);  // bookkeeping keys are not counted
    EXPECT_TRUE(store.delete_key("a"));
    EXPECT_FALSE(store.check({"a"}));
    EXPECT_THROW_MSG(store.wait({"a", "n"}, 10ms), TimeoutError, "still missing: \"a\"");
    EXPECT_THROW_MSG(store.add("c", 1), InvalidArgumentError, "does not hold an integer");
  }
  EXPECT_FALSE(exists(path));  // the only process finished: cleaned up
}

TEST(FileStore, ConcurrentProcessesNeverLoseAnUpdateAndTheLastOneCleansUp) {
  const testing::TempDir dir("file_store");
  const std::string path = dir.path() + "/store";
  const int ok = run_processes(4, [&](int rank) {
    FileStore store(path, world(4));
    for (int k = 0; k < 50; ++k) store.add("sum", 1);
    store.set("done/" + std::to_string(rank), "1");
    store.wait({"done/0", "done/1", "done/2", "done/3"});
    return store.get_string("sum") == "200" ? 0 : 3;
  });
  EXPECT_EQ(ok, 4);
  EXPECT_FALSE(exists(path));
}

TEST(FileStore, WaitSeesAnotherProcesssWrite) {
  const testing::TempDir dir("file_store");
  const std::string path = dir.path() + "/store";
  const int ok = run_processes(2, [&](int rank) {
    FileStore store(path, world(2));
    if (rank == 1) {
      std::this_thread::sleep_for(100ms);
      store.set("late", "v");
      store.wait({"seen"});
      return 0;
    }
    const bool good = store.get_string("late") == "v";
    store.set("seen", "1");
    return good ? 0 : 3;
  });
  EXPECT_EQ(ok, 2);
}

TEST(FileStore, AStaleFileFromAnEarlierRunDoesNotLeakIntoANewOne) {
  const testing::TempDir dir("file_store");
  const std::string path = dir.path() + "/store";
  // An earlier run of 2 whose processes died without cleaning up.
  ASSERT_EQ(run_processes(1, [&](int) {
    auto* first = new FileStore(path, world(2));
    auto* second = new FileStore(path, world(2));
    first->set("old", "stale");
    (void)second;
    std::_Exit(0);  // no destructors: the file stays
    return 0;
  }), 1);
  ASSERT_TRUE(exists(path));
  {
    // Same run id, but that run already had everyone join: reset.
    FileStore a(path, world(2));
    FileStore b(path, world(2));
    EXPECT_FALSE(a.check({"old"}));
    a.set("new", "1");
    EXPECT_EQ(b.get_string("new"), "1");
  }
  EXPECT_FALSE(exists(path));
  // A run that crashed before everyone joined, with the same run id: nobody uses the file,
  // so it is stale too (it used to be joined, and the new run timed out).
  ASSERT_EQ(run_processes(1, [&](int) {
    auto* lone = new FileStore(path, world(3));
    lone->set("old", "stale");
    std::_Exit(0);
    return 0;
  }), 1);
  {
    FileStore a(path, world(3));
    EXPECT_FALSE(a.check({"old"}));
    EXPECT_EQ(a.add("__datapar/joined", 0), 1);  // counted afresh
  }
}

// Issue 27: a second job on a file:// path the first still uses reset the first's store,
// and the first's exit then deleted the second's file. A live store is never reset: the
// newcomer of another run (or a surplus one of this run) is refused, and the store works on.
TEST(FileStore, ALiveStoreOfAnotherJobIsNeverReset) {
  const testing::TempDir dir("file_store");
  const std::string path = dir.path() + "/store";
  {
    FileStore earlier(path, {0, "run-a", 10s});
    earlier.set("mine", "kept");
    EXPECT_THROW_MSG(FileStore(path, {0, "run-b", 10s}), InvalidArgumentError,
                     "is the store of another job, which is still running");
    EXPECT_EQ(earlier.get_string("mine"), "kept");
    // Another process of another job, the same.
    EXPECT_EQ(run_processes(1, [&](int) {
      try {
        FileStore intruder(path, {2, "run-b", 1s});
      } catch (const InvalidArgumentError&) {
        return 0;
      }
      return 3;
    }), 1);
    EXPECT_EQ(earlier.get_string("mine"), "kept");
  }
  EXPECT_FALSE(exists(path));  // its last process removed it
  {
    FileStore first(path, world(1));
    EXPECT_THROW_MSG(FileStore(path, world(1)), InvalidArgumentError, "all 1 processes joined already");
    first.set("k", "v");
    EXPECT_EQ(first.get_string("k"), "v");
  }
  // Once the first job is gone, the second starts on a file of its own.
  FileStore second(path, {0, "run-b", 10s});
  EXPECT_FALSE(second.check({"mine"}));
}

// The file never holds the run id in clear: by default it is the store token.
TEST(FileStore, TheFileHoldsNoRunIdInClear) {
  const testing::TempDir dir("file_store");
  const std::string path = dir.path() + "/store";
  FileStore store(path, {1, "token-like-secret-1234", 10s});
  store.set("k", "v");
  EXPECT_EQ(read_text(path).find("token-like-secret"), std::string::npos);
}

// Finding: a file:// path naming a file that is not a store (a typo, a checkpoint) was
// truncated, written to and deleted at the end. Now it is refused and left as it was.
TEST(FileStore, RefusesAFileThatIsNotAStoreAndLeavesItAlone) {
  const testing::TempDir temp("file_store");
  const std::string& dir = temp.path();
  const std::string precious(100, 'p');
  for (const std::string& content : {precious, std::string("\0\x06\0\0\0run_ix", 11), std::string(1, '\0')}) {
    const std::string path = dir + "/precious";
    std::ofstream(path, std::ios::binary) << content;
    EXPECT_THROW_MSG(FileStore(path, world(1)), InvalidArgumentError, path + " is not a datapar store");
    EXPECT_EQ(read_text(path), content);
  }
  // An empty file is fine to use, and so is a store left by an earlier run.
  const std::string empty = dir + "/empty";
  std::ofstream(empty).close();
  {
    FileStore store(empty, world(1));
    store.set("k", "v");
  }
  EXPECT_FALSE(exists(empty));
}

TEST(FileStore, MissingDirectoryIsAClearError) {
  EXPECT_THROW_MSG(FileStore("/nonexistent-dir/store", world(1)), InvalidArgumentError, "directory exists");
}

}  // namespace
}  // namespace datapar
