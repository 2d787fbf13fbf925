// See owned_directory.h.
#include "owned_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "datapar/error.h"
#include "file_system.h"

namespace datapar::detail {
namespace {

// Whether users besides this one and its group may add entries to the directory `st`
// describes (a sticky bit still lets them add their own).
bool others_can_write(const struct stat& st) {
  return (st.st_mode & S_IWOTH) != 0 || ((st.st_mode & S_IWGRP) != 0 && st.st_gid != ::getegid());
}

}  // namespace

OwnedDirectory OwnedDirectory::open(const std::string& path, std::string* problem) {
  OwnedDirectory dir;
  const std::string made = make_directories(path);
  if (!made.empty()) {
    *problem = made;
    return dir;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    struct stat st {};
    *problem = errno == ELOOP || (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
                   ? str_cat(path, " is a symbolic link: refused, a checkpoint is written into a directory of this "
                                   "user's, never through a link (in a directory others can write, one could send "
                                   "it anywhere). Remove the link or choose another --checkpoint-dir")
                   : str_cat(path, ": ", std::strerror(errno));
    return dir;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid()) {
    *problem = str_cat(path, " is owned by uid ", st.st_uid, ", not by this user (uid ", ::geteuid(),
                       "): refused, a checkpoint is written into a directory of this user's (another user's could "
                       "be read or replaced by them). Remove it or choose another --checkpoint-dir");
    ::close(fd);
    return dir;
  }
  dir.fd_ = fd;
  dir.path_ = path;
  return dir;
}

OwnedDirectory::~OwnedDirectory() {
  if (fd_ >= 0) ::close(fd_);
}

OwnedDirectory::OwnedDirectory(OwnedDirectory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

OwnedDirectory& OwnedDirectory::operator=(OwnedDirectory&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

bool OwnedDirectory::has(const std::string& name) const {
  struct stat st {};
  return fd_ >= 0 && ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

std::string planted_entry_problem(const std::string& path) {
  struct stat entry {}, root {};
  if (::lstat(path.c_str(), &entry) != 0 || entry.st_uid == ::geteuid()) return "";
  if (::stat(directory_of(path).c_str(), &root) != 0 || !others_can_write(root)) return "";
  return str_cat(path, " is ", S_ISLNK(entry.st_mode) ? "a link" : "an entry", " owned by uid ", entry.st_uid,
                 ", not by this user (uid ", ::geteuid(), "), in ", directory_of(path),
                 ", which others can write: refused, anyone there could have planted it. Copy the checkpoint into "
                 "a directory of yours to resume from it");
}

}  // namespace datapar::detail
