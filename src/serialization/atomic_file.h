// AtomicFile: writes a file so that readers (and a later run) see the old file or the
// complete new one, never a torn write, even if the process dies or the machine loses power.
//
// Steps (Note [Atomic file write]):
//   1. write everything to a new temporary file in the same directory (rename is atomic only
//      within one file system), created exclusively under a random name, never through a
//      link (Note [Creating a file] in src/new_file.cc);
//   2. fsync the temporary file, so its bytes are on disk before its name is;
//   3. rename it over <path>;
//   4. fsync the directory, so the rename itself survives a crash.
// The directory is opened once, first, and every step after is relative to it.
// A process killed before step 3 leaves the old file intact and its temporary behind, which
// readers ignore and the next write of the same path on this host removes. A directory
// every user can write (no sticky bit) is refused, one another group can write warned
// about. Not a lock: two writers of one path race, and the last rename wins.
#pragma once

#include <cstddef>
#include <string>

namespace datapar::detail {

class AtomicFile {
 public:
  // Creates the temporary file. Throws CheckpointError if the directory is missing, not
  // writable, or writable by every user.
  explicit AtomicFile(std::string path);
  // `name` in the directory open as `dir_fd` (`dir`: its path, for messages): every step
  // relative to the descriptor (openat, renameat), so a link or directory put at `dir`'s
  // path meanwhile is not written through (OwnedDirectory).
  AtomicFile(int dir_fd, const std::string& dir, const std::string& name);

  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();

  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes. Never throws and always reports `size` as written (so that a caller like
  // the zip writer, which may not survive its own errors, carries on); the first failure is
  // remembered and reported by commit().
  size_t write(const void* data, size_t size) noexcept;

  // Steps 2-4. Throws CheckpointError naming the path if any write, the fsync or the rename
  // failed; the old file is then untouched.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void create(const std::string& dir, const std::string& name);
  // Starts the disk's write of what is written and not yet handed to it (Note [Writing back
  // as we go] in atomic_file.cc).
  void write_back() noexcept;

  std::string path_;
  std::string name_;       // in the directory
  std::string temp_path_;
  std::string temp_name_;  // in the directory
  int dir_fd_ = -1;        // the directory, open from the start
  int fd_ = -1;
  size_t written_ = 0;
  size_t handed_to_disk_ = 0;  // bytes whose writeback has been started
  std::string error_;  // the first write failure, empty if none
  bool committed_ = false;
};

// True for names AtomicFile leaves behind when killed (".x.pt.tmp.<host>.<pid>-<hex>", and
// "x.pt.tmp.<pid>" of earlier versions), so directory scans can skip them.
bool is_atomic_temp_name(const std::string& name);

}  // namespace datapar::detail
