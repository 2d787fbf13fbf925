// Creating files (src/new_file.h, Note [Creating a file]): never through a planted link,
// temporaries under names nobody can guess, a killed writer's temporary removed by the next
// write, and directories other users can write refused or warned about (issue 27).
#include "new_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "child_process.h"
#include "datapar/error.h"
#include "datapar/warning.h"
#include "file_system.h"
#include "serialization/atomic_file.h"
#include "serialization/torch_file.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"
#include "testing/text.h"

namespace datapar::detail {
namespace {

void write_text(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

std::vector<std::string> temporaries_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const std::string& name : list_directory(dir)) {
    if (is_temporary_name(name)) found.push_back(name);
  }
  return found;
}

TEST(NewFile, TemporariesAreNewEachTimeAndNamedUnguessably) {
  const testing::TempDir dir("new_file");
  const std::string target = dir.path() + "/model.pt";
  const TemporaryFile a = create_temporary_beside(target, 0644), b = create_temporary_beside(target, 0644);
  ASSERT_GE(a.fd, 0) << a.error;
  ASSERT_GE(b.fd, 0) << b.error;
  EXPECT_NE(a.path, b.path);
  for (const TemporaryFile* t : {&a, &b}) {
    const std::string name = t->path.substr(dir.path().size() + 1);
    EXPECT_EQ(name.rfind(".model.pt.tmp.", 0), 0u) << name;
    EXPECT_NE(name.find("." + std::to_string(::getpid()) + "-"), std::string::npos) << name;
    EXPECT_TRUE(is_temporary_name(name)) << name;
    ::close(t->fd);
  }
  EXPECT_FALSE(is_temporary_name("model.pt"));
  EXPECT_FALSE(is_temporary_name(".bashrc"));
}

// A link planted at the final name is replaced by the file, and what it pointed to is
// untouched; an append or a truncation never opens a link.
TEST(NewFile, APlantedLinkIsNeverWrittenThrough) {
  const testing::TempDir dir("new_file");
  const std::string victim = dir.path() + "/victim", target = dir.path() + "/checkpoint.pt";
  write_text(victim, "precious");
  ASSERT_EQ(::symlink(victim.c_str(), target.c_str()), 0);
  write_text(target, "checkpoint");
  EXPECT_EQ(testing::read_text(victim), "precious");
  struct stat st {};
  ASSERT_EQ(::lstat(target.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the link itself was replaced";
  EXPECT_EQ(testing::read_text(target), "checkpoint");

  const std::string log = dir.path() + "/metrics.jsonl";
  ASSERT_EQ(::symlink(victim.c_str(), log.c_str()), 0);
  for (const bool append : {true, false}) {
    std::string error;
    EXPECT_EQ(open_for_writing(log, append, 0644, &error), -1);
    EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
    EXPECT_EQ(open_for_update(log, 0644, &error), -1);
  }
  EXPECT_EQ(testing::read_text(victim), "precious");
}

TEST(NewFile, ADirectoryEveryUserCanWriteIsRefusedUnlessSticky) {
  const testing::TempDir dir("new_file");
  const std::string shared = dir.path() + "/shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 0777), 0);
  EXPECT_THROW_MSG(write_text(shared + "/x.pt", "x"), CheckpointError, "is writable by every user (mode 0777");
  EXPECT_FALSE(exists(shared + "/x.pt"));
  EXPECT_TRUE(list_directory(shared).empty()) << "nothing created there";
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);  // as /tmp: only owners rename or remove
  write_text(shared + "/x.pt", "x");
  EXPECT_EQ(testing::read_text(shared + "/x.pt"), "x");
}

// Group-writable by another group: a warning, once per directory, and the file is written.
TEST(NewFile, ADirectoryAnotherGroupCanWriteIsWarnedAboutOnce) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root, to give the directory to another group";
  const testing::TempDir dir("new_file");
  const std::string shared = dir.path() + "/group";
  ASSERT_EQ(::mkdir(shared.c_str(), 0770), 0);
  ASSERT_EQ(::chown(shared.c_str(), 0, 65534), 0);  // nogroup
  ASSERT_EQ(::chmod(shared.c_str(), 0770), 0);
  std::vector<std::string> warnings;
  const WarningSink previous = set_warning_sink([&](const std::string& m) { warnings.push_back(m); });
  write_text(shared + "/a.pt", "a");
  write_text(shared + "/b.pt", "b");
  set_warning_sink(previous);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("writable by group 65534"), std::string::npos) << warnings[0];
  EXPECT_EQ(testing::read_text(shared + "/b.pt"), "b");
}

// Another user (nobody) plants links in a shared sticky directory at every name it can
// guess: the final name and the temporary names of earlier versions. The checkpoint is
// written, the victim untouched.
TEST(NewFile, AnotherUsersPlantedLinksDoNotRedirectACheckpoint) {
  if (::geteuid() != 0) GTEST_SKIP() << "skipped: needs root, to act as the user nobody";
  if (std::system("command -v setpriv >/dev/null") != 0) GTEST_SKIP() << "skipped: setpriv (util-linux) not installed";
  const testing::TempDir dir("new_file");
  ASSERT_EQ(::chmod(dir.path().c_str(), 01777), 0);
  const std::string victim = dir.path() + "/victim", target = dir.path() + "/checkpoint-epoch-1.pt";
  write_text(victim, "precious");
  const std::string plant = "setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c 'ln -s " + victim + " " +
                            target + ".tmp." + std::to_string(::getpid()) + " && ln -s " + victim + " " + target + "'";
  ASSERT_EQ(std::system(plant.c_str()), 0);
  write_text(target, "checkpoint");
  EXPECT_EQ(testing::read_text(victim), "precious");
  EXPECT_EQ(testing::read_text(target), "checkpoint");
}

// A writer killed between its write and its rename leaves its temporary; the next write of
// that file on this host removes it. Earlier versions' names go once an hour old.
TEST(NewFile, AKilledWritersTemporaryIsRemovedByTheNextWrite) {
  const testing::TempDir dir("new_file");
  const std::string target = dir.path() + "/checkpoint.pt";
  const pid_t pid = fork_child([&] {
    AtomicFile file(target);
    const std::string junk(1 << 20, 'x');
    file.write(junk.data(), junk.size());
    std::_Exit(0);  // no destructor, no commit: as a crash
    return 0;
  });
  ASSERT_EQ(wait_child(pid).exit_code, 0);
  ASSERT_EQ(temporaries_in(dir.path()).size(), 1u);

  const std::string old_recent = dir.path() + "/checkpoint.pt.tmp." + std::to_string(pid);
  const std::string old_stale = dir.path() + "/checkpoint.pt.tmp.999999999";
  write_text(old_recent, "");  // an earlier version's names, of processes that are gone
  write_text(old_stale, "");
  const std::string touch = "touch -d '2 hours ago' " + old_stale;
  ASSERT_EQ(std::system(touch.c_str()), 0);

  write_text(target, "next");
  const std::vector<std::string> left = temporaries_in(dir.path());
  ASSERT_EQ(left.size(), 1u) << "the killed writer's and the stale old-style temporary are gone";
  EXPECT_EQ(left[0], "checkpoint.pt.tmp." + std::to_string(pid)) << "under an hour old: perhaps another host's";
}

}  // namespace
}  // namespace datapar::detail
