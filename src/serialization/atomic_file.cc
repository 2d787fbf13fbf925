// AtomicFile. See atomic_file.h and Note [Atomic file write].
#include "serialization/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string atomic_temp_path(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

bool is_atomic_temp_name(const std::string& name) {
  const size_t pos = name.rfind(".tmp.");
  if (pos == std::string::npos || pos + 5 == name.size()) return false;
  for (size_t i = pos + 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_path_(atomic_temp_path(path_)) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw CheckpointError(str_cat(path_, ": cannot create ", temp_path_, " (", errno_text(errno),
                                  "). Check that the directory exists and is writable."));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

size_t AtomicFile::write(const void* data, size_t size) noexcept {
  if (!error_.empty()) return size;
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? errno_text(errno) : "no progress";
      break;
    }
    done += static_cast<size_t>(n);
  }
  written_ += done;
  return size;
}

void AtomicFile::commit() {
  if (!error_.empty()) {
    throw CheckpointError(str_cat(path_, ": write failed after ", written_, " bytes (", error_,
                                  "). Is the disk full? The previous file, if any, is unchanged."));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const std::string why = errno_text(errno);
    ::close(fd);
    throw CheckpointError(str_cat(path_, ": could not flush ", temp_path_, " to disk (", why, ")."));
  }
  if (::close(fd) != 0) {
    throw CheckpointError(str_cat(path_, ": could not close ", temp_path_, " (", errno_text(errno), ")."));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw CheckpointError(str_cat(path_, ": could not move ", temp_path_, " into place (", errno_text(errno), ")."));
  }
  committed_ = true;
  // Step 4: the rename lives in the directory, so the directory must reach the disk too.
  // Some file systems refuse fsync on a directory; the file itself is complete either way.
  const int dfd = ::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace datapar::detail
