// See new_file.h.
//
// Note [Creating a file]
// In a directory another user can write, a name can be planted before datapar opens it: a
// symbolic link "checkpoint.pt.tmp.<pid>" to that user's victim (or to one of ours) made an
// O_CREAT | O_TRUNC open overwrite the victim, and the rename then put the link in place of
// the checkpoint. So:
//   - every open that may create a file passes O_NOFOLLOW: a link at the name fails (ELOOP);
//   - a file written whole is first created exclusively (O_CREAT | O_EXCL) under a name
//     with 64 random bits, which nobody can plant ahead; a clash tries another name;
//   - its writer renames it over the final name, which replaces whatever is there (a link
//     included) without following it;
//   - writers refuse a directory where others could rename or remove their files between
//     the write and the rename (writable by others, no sticky bit), and warn for one
//     writable by its group (AtomicFile).
// The temporary name carries this host and pid: a temporary left by a killed process is
// removed by the next write of the same file on the same host, once no process has that pid;
// another host's are never judged.
#include "new_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "file_system.h"
#include "random_bytes.h"

namespace datapar::detail {
namespace {

std::string name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string host() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "host";
  std::string h = name;
  for (char& c : h) {
    if (c == '/' || c == '-') c = '_';  // '-' ends the pid in the name
  }
  return h;
}

bool all_digits(const std::string& s) { return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos; }

bool dead(const std::string& digits) {
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

// Removes this user's temporaries of `name` in directory `dir_fd` that killed processes left.
void remove_leftovers(int dir_fd, const std::string& name, const std::string& this_host) {
  const std::string current = "." + name + ".tmp." + this_host + ".";  // + "<pid>-<hex>"
  const std::string earlier = name + ".tmp.";                          // + "<pid>", before issue 27
  const int scan_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);  // fdopendir owns the one it is given
  if (scan_fd < 0) return;
  ::lseek(scan_fd, 0, SEEK_SET);
  DIR* d = ::fdopendir(scan_fd);
  if (d == nullptr) {
    ::close(scan_fd);
    return;
  }
  const auto now = std::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const std::string entry = e->d_name;
    bool stale = false;
    bool old_format = false;
    if (entry.compare(0, current.size(), current) == 0) {
      const size_t dash = entry.find('-', current.size());
      if (dash == std::string::npos) continue;
      const std::string pid = entry.substr(current.size(), dash - current.size());
      stale = all_digits(pid) && dead(pid);
    } else if (entry.compare(0, earlier.size(), earlier) == 0) {
      const std::string pid = entry.substr(earlier.size());
      stale = all_digits(pid) && dead(pid);
      old_format = true;
    }
    if (!stale) continue;
    struct stat st {};
    if (::fstatat(dir_fd, entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != ::geteuid() ||
        !S_ISREG(st.st_mode)) {
      continue;
    }
    // The old names carry no host: one on a shared file system may be another host's write
    // in progress, which no write takes an hour for.
    if (old_format && now - st.st_mtime < 3600) continue;
    ::unlinkat(dir_fd, entry.c_str(), 0);
  }
  ::closedir(d);
}

int open_no_follow(const std::string& path, int flags, mode_t mode, std::string* error) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && error != nullptr) {
    *error = errno == ELOOP ? "it is a symbolic link, which datapar does not write through" : std::strerror(errno);
  }
  return fd;
}

}  // namespace

TemporaryFile create_temporary_beside(const std::string& target, mode_t mode) {
  const std::string dir = directory_of(target);
  TemporaryFile file;
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    file.error = std::strerror(errno);
    return file;
  }
  file = create_temporary_in(dir_fd, dir, name_of(target), mode);
  ::close(dir_fd);
  return file;
}

TemporaryFile create_temporary_in(int dir_fd, const std::string& dir, const std::string& name, mode_t mode) {
  const std::string this_host = host();
  remove_leftovers(dir_fd, name, this_host);
  TemporaryFile file;
  const std::string stem = "." + name + ".tmp." + this_host + "." + std::to_string(::getpid()) + "-";
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string hex = random_hex(8);
    if (hex.empty()) {
      file.error = std::string("cannot read random bytes: ") + std::strerror(errno);
      return file;
    }
    file.name = stem + hex;
    file.path = dir + "/" + file.name;
    do {
      file.fd = ::openat(dir_fd, file.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    } while (file.fd < 0 && errno == EINTR);
    if (file.fd >= 0 || errno != EEXIST) break;  // taken (planted?): another name
  }
  if (file.fd < 0 && file.error.empty()) file.error = errno == EEXIST ? "every name tried was taken" : std::strerror(errno);
  return file;
}

int open_for_writing(const std::string& path, bool append, mode_t mode, std::string* error) {
  return open_no_follow(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), mode, error);
}

int open_for_update(const std::string& path, mode_t mode, std::string* error) {
  return open_no_follow(path, O_RDWR | O_CREAT, mode, error);
}

bool is_temporary_name(const std::string& name) {
  if (name.size() > 1 && name[0] == '.' && name.find(".tmp.") != std::string::npos) {
    const size_t dash = name.rfind('-');
    return dash != std::string::npos && name.size() - dash - 1 == 16;
  }
  const size_t pos = name.rfind(".tmp.");
  return pos != std::string::npos && all_digits(name.substr(pos + 5));
}

namespace {

DirectoryExposure exposure_of(const struct stat& st, std::string* why) {
  if (!S_ISDIR(st.st_mode)) return DirectoryExposure::kPrivate;
  if ((st.st_mode & S_ISVTX) != 0) return DirectoryExposure::kPrivate;  // only owners rename or remove
  char mode[8];
  std::snprintf(mode, sizeof(mode), "0%o", static_cast<unsigned>(st.st_mode & 07777));
  if ((st.st_mode & S_IWOTH) != 0) {
    *why = std::string("writable by every user (mode ") + mode + ", no sticky bit)";
    return DirectoryExposure::kEveryone;
  }
  // A group-writable directory of this process's own group: on Debian, a user's private group.
  if ((st.st_mode & S_IWGRP) != 0 && st.st_gid != ::getegid()) {
    *why = std::string("writable by group ") + std::to_string(st.st_gid) + " (mode " + mode + ", no sticky bit)";
    return DirectoryExposure::kGroup;
  }
  return DirectoryExposure::kPrivate;
}

}  // namespace

DirectoryExposure directory_exposure(const std::string& dir, std::string* why) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return DirectoryExposure::kPrivate;
  return exposure_of(st, why);
}

DirectoryExposure directory_exposure(int dir_fd, std::string* why) {
  struct stat st {};
  if (::fstat(dir_fd, &st) != 0) return DirectoryExposure::kPrivate;
  return exposure_of(st, why);
}

}  // namespace datapar::detail
