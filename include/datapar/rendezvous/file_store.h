// FileStore: a Store in one file on a filesystem every process can reach (local, or shared
// like NFS), for jobs started with init_method file:///path.
//
// The file is an append-only log of records, read and written under a lock of the file
// (an OFD lock, NFS included): any number of processes may use it at once. Waiting polls
// the file (every 5 ms, backing off to 100 ms), because an NFS client only sees other
// hosts' writes when it looks again.
// Cleanup: every FileStore counts itself in when it opens the file and out when destroyed;
// the last of world_size processes to finish removes the file.
// Stale and live files (Note [Live stores] in file_store.cc): every FileStore marks the
// file as in use while it has it open. A file nobody uses is stale, left by a run that
// crashed, and the first process of the next run starts it afresh. A file in use by
// another run (another run id), or by a run all of whose world_size processes joined, is
// never reset: the newcomer is refused with InvalidArgumentError. The file holds a digest
// of the run id, never the run id (which may be the store token).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/rendezvous/store.h"

namespace datapar {

struct FileStoreOptions {
  // How many processes share the file (counted in to remove it when all are done).
  // 0 or less: unknown; the file is removed when no FileStore has it open.
  int world_size = 0;
  // This run's id; empty: none. rendezvous() passes JobConfig::run_id (DATAPAR_RUN_ID, else
  // DATAPAR_STORE_TOKEN); the store itself reads no environment.
  std::string run_id;
  // Limit for every wait.
  std::chrono::milliseconds timeout = kDefaultTimeout;
};

class FileStore : public Store {
 public:
  // Opens (or creates) the store file at path. Throws InvalidArgumentError if the file
  // cannot be created there (say, its directory does not exist), if it exists, is not
  // empty and is not a store (then nothing is written to it), or if it is the live store
  // of another run (Note [Live stores]; it is left as it is).
  FileStore(std::string path, FileStoreOptions options = {});
  // Counts this process out; the last one removes the file. Never throws.
  ~FileStore() override;

  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  // Thread-safe. Throw CommError if the file cannot be read or written.
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::set;
  using Store::wait;

  const std::string& path() const { return path_; }

 private:
  class Lock;
  static bool is_store_file(int fd);  // REQUIRES: the file lock held
  void join_locked();                 // REQUIRES: exclusive lock
  void refresh();  // REQUIRES: the file lock held
  void append(uint8_t type, const std::string& key, const Bytes& value);  // REQUIRES: exclusive lock
  int64_t add_locked(const std::string& key, int64_t delta);
  bool has_all(const std::vector<std::string>& keys) const;

  std::string path_;
  FileStoreOptions options_;
  int fd_ = -1;
  std::mutex mutex_;       // one operation at a time within this process
  std::map<std::string, Bytes> table_;  // the file's content up to offset_
  Bytes run_digest_;  // of options_.run_id: the file holds no run id in clear (it may be the token)
  Bytes file_run_;    // the digest in the file's header
  int64_t offset_ = 0;
};

}  // namespace datapar
