// FileStore. See file_store.h.
//
// File format: a sequence of records, each `u8 type, u32 key length, key, u32 value length,
// value` (little-endian lengths). Type 0 is the header, written first, whose value is the
// run id's digest; type 1 sets a key; type 2 deletes one. The file is only appended to,
// under an exclusive lock (Note [Live stores]), so a reader under a shared lock sees whole
// records; a torn record left by a writer that died mid-write is cut off by the next writer. The bookkeeping keys
// (kJoined, kFinished) live in the same table under a reserved prefix.
#include "datapar/rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "datapar/error.h"
#include "new_file.h"
#include "rendezvous/store_handshake.h"

namespace datapar {
namespace {

using detail::str_cat;

constexpr uint8_t kHeader = 0;
constexpr uint8_t kSetRecord = 1;
constexpr uint8_t kDeleteRecord = 2;
constexpr uint32_t kMaxRunId = 4096;  // longer: not a header of ours
const std::string kReserved = "__datapar/";
const std::string kJoined = kReserved + "joined";
const std::string kFinished = kReserved + "finished";

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

std::string join(const std::vector<std::string>& keys) {
  std::ostringstream out;
  for (size_t i = 0; i < keys.size(); ++i) out << (i ? ", " : "") << '"' << keys[i] << '"';
  return out.str();
}

int64_t as_integer(const Bytes& value, const std::string& key) {
  const std::string text(value.begin(), value.end());
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  DATAPAR_CHECK(!text.empty() && errno == 0 && *end == '\0', "FileStore: add: key \"", key,
                "\" does not hold an integer.");
  return v;
}

}  // namespace

namespace {

// Note [Live stores]
// Every FileStore holds two kinds of open-file-description (OFD) locks on its file:
//   - the data range [0, kLiveByte): exclusive to write, shared to read (FileStore::Lock);
//   - the byte kLiveByte, shared, from its join until it closes the file: "a process uses
//     this store". The kernel drops it when the process dies, however it dies.
// A process that finds a store file nobody holds (F_OFD_GETLK) knows it is stale, whatever
// run left it, and starts it afresh; one that finds a live store of another run, or of a
// run that everyone joined already, is refused: resetting it broke a running job, whose
// exit then deleted the newcomer's file (issue 27). The two ranges never overlap, so the
// locks work over NFS too, where flock() is emulated with whole-file POSIX locks that would
// have collided with the liveness byte. OFD locks belong to the open file, as flock's did:
// two threads of one process would share them, and mutex_ keeps them apart.
constexpr off_t kLiveByte = off_t{1} << 62;

bool set_lock(int fd, short type, off_t start, off_t length, bool wait) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = start;
  lock.l_len = length;
  for (;;) {
    if (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &lock) == 0) return true;
    if (errno != EINTR) return false;
  }
}

// Whether a process other than this FileStore holds the file's liveness byte.
bool used_by_others(int fd) {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = kLiveByte;
  probe.l_len = 1;
  if (::fcntl(fd, F_OFD_GETLK, &probe) != 0) {
    throw CommError(str_cat("FileStore: cannot test the store file's lock (", std::strerror(errno), ")."));
  }
  return probe.l_type != F_UNLCK;
}

// Whether `fd` is still the file at `path` (the last process of an earlier run may have
// removed it between our open and our lock).
bool still_at(int fd, const std::string& path) {
  struct stat mine {}, there {};
  return ::fstat(fd, &mine) == 0 && ::stat(path.c_str(), &there) == 0 && mine.st_dev == there.st_dev &&
         mine.st_ino == there.st_ino;
}

}  // namespace

// The data range's lock, held for the lifetime of the object.
class FileStore::Lock {
 public:
  Lock(int fd, bool exclusive) : fd_(fd) {
    if (!set_lock(fd_, exclusive ? F_WRLCK : F_RDLCK, 0, kLiveByte, /*wait=*/true)) {
      throw CommError(str_cat("FileStore: cannot lock the store file (", std::strerror(errno), ")."));
    }
  }
  ~Lock() { set_lock(fd_, F_UNLCK, 0, kLiveByte, /*wait=*/false); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, FileStoreOptions options)
    : Store(options.timeout), path_(std::move(path)), options_(std::move(options)) {
  run_digest_ = detail::handshake::run_digest(options_.run_id);
  std::lock_guard<std::mutex> guard(mutex_);
  for (int attempt = 0;; ++attempt) {
    std::string error;
    fd_ = detail::open_for_update(path_, 0644, &error);  // never through a link (Note [Creating a file])
    DATAPAR_CHECK(fd_ >= 0, "FileStore: cannot open ", path_, " (", error,
                  "). Check that the directory exists and every process can write to it.");
    try {
      Lock lock(fd_, /*exclusive=*/true);
      if (!still_at(fd_, path_) && attempt < 8) {  // removed meanwhile: open the new one
        ::close(fd_);
        continue;
      }
      // Before anything is read or written: a file that is not a store is someone's data.
      DATAPAR_CHECK(is_store_file(fd_), "FileStore: ", path_, " is not a datapar store (it holds other data), so it ",
                    "was left as it is. Check the file:// path, or give a new or empty file.");
      join_locked();
      return;
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
}

bool FileStore::is_store_file(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw CommError(str_cat("FileStore: cannot stat store file: ", std::strerror(errno)));
  if (st.st_size == 0) return true;  // new, or reset: ours to use
  // The header record: type 0, the key "run_id", then the run id's length.
  const std::string expected = std::string(1, static_cast<char>(kHeader)) + std::string("\x06\0\0\0", 4) + "run_id";
  char head[15];
  if (st.st_size < static_cast<off_t>(sizeof(head)) || ::pread(fd, head, sizeof(head), 0) != sizeof(head)) return false;
  return std::string(head, expected.size()) == expected && get_u32(reinterpret_cast<uint8_t*>(head) + 11) <= kMaxRunId;
}

void FileStore::join_locked() {
  refresh();
  if (offset_ > 0) {
    const auto joined = table_.find(kJoined);
    const int64_t count = joined == table_.end() ? 0 : as_integer(joined->second, kJoined);
    if (used_by_others(fd_)) {  // Note [Live stores]
      DATAPAR_CHECK(file_run_ == run_digest_, "FileStore: ", path_, " is the store of another job, which is still ",
                    "running (", count, " processes joined it; its run id differs from this process's). This ",
                    "process leaves it alone: give each job its own file:// path.");
      DATAPAR_CHECK(options_.world_size <= 0 || count < options_.world_size, "FileStore: ", path_,
                    " is the store of a running job of this run id that all ", options_.world_size,
                    " processes joined already: is this a second job with the same run id (DATAPAR_RUN_ID)? Give ",
                    "each job its own file:// path and run id.");
    } else {
      // Stale: nobody uses it, whatever run left it. Start afresh rather than read its keys.
      if (::ftruncate(fd_, 0) != 0) throw CommError(str_cat("FileStore: cannot reset stale ", path_, ": ", std::strerror(errno)));
      table_.clear();
      offset_ = 0;
    }
  }
  if (offset_ == 0) {
    append(kHeader, "run_id", run_digest_);
    file_run_ = run_digest_;
  }
  add_locked(kJoined, 1);
  // From now until the file is closed, this process uses the store.
  if (!set_lock(fd_, F_RDLCK, kLiveByte, 1, /*wait=*/false)) {
    throw CommError(str_cat("FileStore: cannot mark ", path_, " as in use (", std::strerror(errno), ")."));
  }
}

FileStore::~FileStore() {
  try {
    std::lock_guard<std::mutex> guard(mutex_);
    Lock lock(fd_, /*exclusive=*/true);
    refresh();
    const int64_t finished = add_locked(kFinished, 1);
    const auto joined = table_.find(kJoined);
    const int64_t everyone = options_.world_size > 0 ? options_.world_size
                                                     : (joined == table_.end() ? 0 : as_integer(joined->second, kJoined));
    if (finished >= everyone && still_at(fd_, path_)) ::unlink(path_.c_str());
  } catch (...) {
    // Cleanup is best effort; a leftover file is recognised as stale by the next run.
  }
  ::close(fd_);
}

void FileStore::refresh() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw CommError(str_cat("FileStore: cannot stat ", path_, ": ", std::strerror(errno)));
  if (st.st_size < offset_) {  // reset by another process: read from the start
    table_.clear();
    file_run_.clear();
    offset_ = 0;
  }
  if (st.st_size == offset_) return;
  Bytes data(static_cast<size_t>(st.st_size - offset_));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::pread(fd_, data.data() + got, data.size() - got, offset_ + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  size_t pos = 0;
  while (pos + 5 <= got) {  // type + key length
    const uint8_t type = data[pos];
    const uint32_t key_len = get_u32(&data[pos + 1]);
    if (pos + 5 + key_len + 4 > got) break;
    const uint32_t value_len = get_u32(&data[pos + 5 + key_len]);
    const size_t end = pos + 9 + key_len + value_len;
    if (end > got) break;
    std::string key(data.begin() + pos + 5, data.begin() + pos + 5 + key_len);
    Bytes value(data.begin() + pos + 9 + key_len, data.begin() + end);
    if (type == kHeader) {
      file_run_ = std::move(value);
    } else if (type == kSetRecord) {
      table_[std::move(key)] = std::move(value);
    } else if (type == kDeleteRecord) {
      table_.erase(key);
    } else {
      throw CommError(str_cat("FileStore: ", path_, " is corrupt (record type ", int{type}, " at byte ",
                              offset_ + static_cast<int64_t>(pos), "). Delete it and restart the job."));
    }
    pos = end;
  }
  offset_ += static_cast<int64_t>(pos);
}

void FileStore::append(uint8_t type, const std::string& key, const Bytes& value) {
  // A torn record at the end (its writer died mid-write) would hide everything after it.
  if (::ftruncate(fd_, offset_) != 0) throw CommError(str_cat("FileStore: cannot write ", path_, ": ", std::strerror(errno)));
  Bytes record{type};
  put_u32(record, static_cast<uint32_t>(key.size()));
  record.insert(record.end(), key.begin(), key.end());
  put_u32(record, static_cast<uint32_t>(value.size()));
  record.insert(record.end(), value.begin(), value.end());
  size_t put = 0;
  while (put < record.size()) {
    const ssize_t n = ::pwrite(fd_, record.data() + put, record.size() - put, offset_ + static_cast<off_t>(put));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CommError(str_cat("FileStore: cannot write ", path_, ": ", std::strerror(errno), ". Is the disk full?"));
    put += static_cast<size_t>(n);
  }
  offset_ += static_cast<int64_t>(record.size());
  if (type == kSetRecord) table_[key] = value;
  if (type == kDeleteRecord) table_.erase(key);
}

int64_t FileStore::add_locked(const std::string& key, int64_t delta) {
  auto it = table_.find(key);
  const int64_t value = (it == table_.end() ? 0 : as_integer(it->second, key)) + delta;
  const std::string text = std::to_string(value);
  append(kSetRecord, key, Bytes(text.begin(), text.end()));
  return value;
}

bool FileStore::has_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return table_.count(k) > 0; });
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true);
  refresh();
  append(kSetRecord, key, value);
}

Bytes FileStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, false);
  refresh();
  auto it = table_.find(key);
  if (it == table_.end()) throw TimeoutError(str_cat("FileStore: key \"", key, "\" in ", path_, " was deleted while being read."));
  return it->second;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true);
  refresh();
  return add_locked(key, delta);
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true);
  refresh();
  auto it = table_.find(key);
  if (it == table_.end()) {
    if (!expected.empty()) return expected;
    append(kSetRecord, key, desired);
    return desired;
  }
  if (it->second == expected) append(kSetRecord, key, desired);
  return table_.at(key);
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + wait_timeout;
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    std::vector<std::string> missing;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      Lock lock(fd_, false);
      refresh();
      for (const std::string& k : keys) {
        if (!table_.count(k)) missing.push_back(k);
      }
    }
    if (missing.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw TimeoutError(str_cat("FileStore: waited ", std::chrono::duration<double>(wait_timeout).count(), " s in ",
                                 path_, " for ", join(keys), "; still missing: ", join(missing),
                                 ". Did every process start, with the same file:// path?"));
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, false);
  refresh();
  return has_all(keys);
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, true);
  refresh();
  if (!table_.count(key)) return false;
  append(kDeleteRecord, key, {});
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> guard(mutex_);
  Lock lock(fd_, false);
  refresh();
  return std::count_if(table_.begin(), table_.end(),
                       [](const auto& item) { return item.first.rfind(kReserved, 0) != 0; });
}

}  // namespace datapar
