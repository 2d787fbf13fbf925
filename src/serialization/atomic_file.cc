// AtomicFile. See atomic_file.h and Note [Atomic file write].
#include "serialization/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <mutex>
#include <set>

#include "datapar/error.h"
#include "datapar/warning.h"
#include "file_system.h"
#include "new_file.h"

namespace datapar::detail {
namespace {

// Note [Writing back as we go]
// A checkpoint of gigabytes used to sit dirty in the page cache until the fsync of commit():
// the kernel's flusher threads wrote it back meanwhile at the training's priority, and the
// fsync waited for the rest. Now each chunk is handed to the disk as soon as it is written
// (sync_file_range, SYNC_FILE_RANGE_WRITE: starts the writeback, waits for nothing), so the
// disk works while the file is written and the writeback's CPU work is done by the thread
// that writes (a background writer runs at nice 19: BackgroundWriter::run). The pages stay
// cached (clean): a load right after a save still reads memory.
constexpr size_t kWriteBackChunk = size_t{8} << 20;

std::string errno_text(int err) { return std::strerror(err); }

std::string name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Each directory's warning once per process: a checkpoint every epoch would repeat it.
void warn_once_for(const std::string& dir, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (warned.insert(dir).second) warn(message);
}

}  // namespace

bool is_atomic_temp_name(const std::string& name) { return is_temporary_name(name); }

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const std::string dir = directory_of(path_);
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) {
    throw CheckpointError(str_cat(path_, ": cannot create a file in its directory ", dir, " (", errno_text(errno),
                                  "). Check that the directory exists and is writable."));
  }
  create(dir, name_of(path_));
}

AtomicFile::AtomicFile(int dir_fd, const std::string& dir, const std::string& name) : path_(dir + "/" + name) {
  dir_fd_ = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dir_fd_ < 0) throw CheckpointError(str_cat(path_, ": cannot use its directory (", errno_text(errno), ")."));
  create(dir, name);
}

void AtomicFile::create(const std::string& dir, const std::string& name) {
  name_ = name;
  std::string why;
  switch (directory_exposure(dir_fd_, &why)) {
    case DirectoryExposure::kEveryone:
      throw CheckpointError(str_cat(path_, ": not written: its directory ", dir, " is ", why,
                                    ", so another user could put a file or link of theirs in its place. Write into a "
                                    "directory only you can write, or make this one so (chmod o-w ", dir,
                                    "), or give it the sticky bit (chmod +t ", dir, ")."));
    case DirectoryExposure::kGroup:
      warn_once_for(dir, str_cat(dir, " is ", why, ": its members could replace what datapar writes there (", path_,
                                 "). Prefer a directory only you can write."));
      break;
    case DirectoryExposure::kPrivate:
      break;
  }
  const TemporaryFile temp = create_temporary_in(dir_fd_, dir, name, 0644);  // Note [Creating a file]
  if (temp.fd < 0) {
    throw CheckpointError(str_cat(path_, ": cannot create a temporary file beside it (", temp.error,
                                  "). Check that the directory exists and is writable."));
  }
  fd_ = temp.fd;
  temp_path_ = temp.path;
  temp_name_ = temp.name;
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_name_.empty()) ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

size_t AtomicFile::write(const void* data, size_t size) noexcept {
  if (!error_.empty()) return size;
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, bytes + done, std::min(size - done, kWriteBackChunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? errno_text(errno) : "no progress";
      break;
    }
    done += static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
    write_back();
  }
  return size;
}

void AtomicFile::write_back() noexcept {
#ifdef __linux__
  // Note [Writing back as we go]. A failure here is the fsync's to report.
  while (written_ - handed_to_disk_ >= kWriteBackChunk) {
    (void)::sync_file_range(fd_, static_cast<off_t>(handed_to_disk_), static_cast<off_t>(kWriteBackChunk),
                            SYNC_FILE_RANGE_WRITE);
    handed_to_disk_ += kWriteBackChunk;
  }
#endif
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
  // Relative to the directory opened at the start: a link put at its path meanwhile is not
  // followed (Note [Atomic file write]).
  if (::renameat(dir_fd_, temp_name_.c_str(), dir_fd_, name_.c_str()) != 0) {
    throw CheckpointError(str_cat(path_, ": could not move ", temp_path_, " into place (", errno_text(errno), ")."));
  }
  committed_ = true;
  // Step 4: the rename lives in the directory, so the directory must reach the disk too.
  // Some file systems refuse fsync on a directory; the file itself is complete either way.
  ::fsync(dir_fd_);
}

}  // namespace datapar::detail
