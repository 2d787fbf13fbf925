// Creating the files datapar writes (Note [Creating a file] in new_file.cc). Checkpoints,
// traces, plots, metrics logs, FileStore files and store tokens all open their files here:
// never through a link someone planted, and, for files written whole, under a temporary
// name nobody can guess, created exclusively and renamed into place (AtomicFile).
#pragma once

#include <sys/types.h>

#include <string>

namespace datapar::detail {

// A file just made by create_temporary_beside: open for writing as `fd`, at `path`; or
// fd -1 and `error`, why none could be made.
struct TemporaryFile {
  int fd = -1;
  std::string path;
  std::string name;  // its name in its directory
  std::string error;
};

// Creates, exclusively, a new file in the directory of `target`, named
// ".<target's name>.tmp.<host>.<pid>-<16 random hex digits>", mode `mode` less the umask.
// First removes the temporaries of `target` that this user's processes on this host left
// when they were killed (and those of earlier versions, "<name>.tmp.<pid>", an hour old).
TemporaryFile create_temporary_beside(const std::string& target, mode_t mode);
// The same in the directory open as `dir_fd` (`dir`: its path, for messages), relative to
// the descriptor: whatever is put at the directory's path meanwhile is not written.
TemporaryFile create_temporary_in(int dir_fd, const std::string& dir, const std::string& name, mode_t mode);

// Opens `path` for writing, created if missing (mode `mode` less the umask), appending or
// truncating; never through a link at `path` (ELOOP). Returns the descriptor, or -1 with
// *error set.
int open_for_writing(const std::string& path, bool append, mode_t mode, std::string* error);

// Opens `path` for reading and writing, created if missing; never through a link.
int open_for_update(const std::string& path, mode_t mode, std::string* error);

// True for the temporaries above ("." + name + ".tmp." ...) and for those of earlier
// versions ("<name>.tmp.<pid>"): directory scans skip them.
bool is_temporary_name(const std::string& name);

// Who besides this user may rename or remove what is in directory `dir` (and so replace a
// file between its write and its rename): nobody (kPrivate; also a directory with the
// sticky bit, as /tmp, or one that cannot be examined, whose write will say why), the
// members of a group that is not this process's (kGroup), or every user (kEveryone).
// *why: the mode, for a message.
enum class DirectoryExposure { kPrivate, kGroup, kEveryone };
DirectoryExposure directory_exposure(const std::string& dir, std::string* why);
DirectoryExposure directory_exposure(int dir_fd, std::string* why);

}  // namespace datapar::detail
