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

// Removes this user's temporaries of `name` in `dir` that killed processes left.
void remove_leftovers(const std::string& dir, const std::string& name, const std::string& this_host) {
  const std::string current = "." + name + ".tmp." + this_host + ".";  // + "<pid>-<hex>"
  const std::string earlier = name + ".tmp.";                          // + "<pid>", before issue 27
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
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
    const std::string path = dir + "/" + entry;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid() || !S_ISREG(st.st_mode)) continue;
    // The old names carry no host: one on a shared file system may be another host's write
    // in progress, which no write takes an hour for.
    if (old_format && now - st.st_mtime < 3600) continue;
    ::unlink(path.c_str());
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
  const std::string dir = directory_of(target), name = name_of(target), this_host = host();
  remove_leftovers(dir, name, this_host);
  TemporaryFile file;
  const std::string stem = dir + "/." + name + ".tmp." + this_host + "." + std::to_string(::getpid()) + "-";
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string hex = random_hex(8);
    if (hex.empty()) {
      file.error = std::string("cannot read random bytes: ") + std::strerror(errno);
      return file;
    }
    file.path = stem + hex;
    file.fd = open_no_follow(file.path, O_WRONLY | O_CREAT | O_EXCL, mode, &file.error);
    if (file.fd >= 0 || errno != EEXIST) break;  // taken (planted?): another name
  }
  if (file.fd < 0 && file.error.empty()) file.error = "every name tried was taken";
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

DirectoryExposure directory_exposure(const std::string& dir, std::string* why) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return DirectoryExposure::kPrivate;
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

}  // namespace datapar::detail
