// OwnedDirectory: a directory datapar writes a checkpoint into by its descriptor (issue 46).
// In a shared checkpoint root (mode 1777, as /tmp) another user can plant a link named
// like the next checkpoint ("epoch-2" -> a victim's directory) or a directory of theirs:
// a write by path would follow the link, or fill their directory. So the directory is made
// if missing, opened without following a link at its last component (O_NOFOLLOW), refused
// unless this user owns it, and every file is written relative to the descriptor
// (AtomicFile(dir_fd, ...)): whatever is put at its path later is not written.
#pragma once

#include <string>

namespace datapar::detail {

class OwnedDirectory {
 public:
  // Makes `path` (and its missing parents) and opens it. On failure the result is not
  // ok() and *problem says why ("... is a symbolic link", "... is owned by uid N").
  static OwnedDirectory open(const std::string& path, std::string* problem);

  OwnedDirectory() = default;
  ~OwnedDirectory();
  OwnedDirectory(OwnedDirectory&& other) noexcept;
  OwnedDirectory& operator=(OwnedDirectory&& other) noexcept;
  OwnedDirectory(const OwnedDirectory&) = delete;
  OwnedDirectory& operator=(const OwnedDirectory&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Whether an entry `name` is in it (a link counts, not followed).
  bool has(const std::string& name) const;

 private:
  int fd_ = -1;
  std::string path_;
};

// Why the checkpoint at `path` (an entry of a checkpoint root) must not be read: it is a
// link or directory owned by another user in a root that others can write (anyone could
// have planted it). "" when it may be read.
std::string planted_entry_problem(const std::string& path);

}  // namespace datapar::detail
