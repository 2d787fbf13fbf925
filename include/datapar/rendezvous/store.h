// Store: the small key-value service processes use to find each other (rendezvous).
//
// Keys are strings, values are byte strings. Every call that waits for a key does so for at
// most the store's timeout (wait(): the one it is given) and then throws
// datapar::TimeoutError naming the keys; nothing blocks forever. Implementations: TcpStore
// (a server hosted by rank 0, or standalone), FileStore (a file on a filesystem every
// process can reach) and PrefixStore (a namespace inside another store).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "datapar/timeout.h"

namespace datapar {

using Bytes = std::vector<uint8_t>;

// A value's bytes as text: what a job writes to its store (ids, numbers, tokens) is text.
inline std::string as_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;

  // Sets key to value, replacing any value it had. Wakes whoever waits for key.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // The value of key. Waits until it exists, up to timeout(); then throws TimeoutError.
  virtual Bytes get(const std::string& key) = 0;

  // Adds delta to the integer stored at key (a missing key counts as 0) and returns the
  // new value. Atomic: concurrent adds from many processes never lose an update.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // If key holds `expected` (or is missing and `expected` is empty), sets it to `desired`.
  // Returns the value key holds afterwards; a missing key with non-empty `expected` is
  // left missing and `expected` is returned. Atomic.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;

  // Waits until every key exists, up to `timeout`; then throws TimeoutError naming the
  // keys still missing.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // Whether every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Removes key; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // How many keys the store holds (for a PrefixStore: the whole underlying store's).
  virtual int64_t num_keys() = 0;

  // A second, independent connection to the same store, whose calls wait for its server
  // at most `timeout` (as PyTorch's Store::clone): for a thread that must neither queue
  // behind another's long wait nor wait longer than it can afford (a stall inspector). Null
  // when the store has no server to wait for (FileStore): use this one.
  virtual std::shared_ptr<Store> clone(std::chrono::milliseconds /*timeout*/) const { return nullptr; }

  // Where the store is served, for messages ("127.0.0.1:29500"); "" when nowhere in
  // particular (FileStore).
  virtual std::string address() const { return ""; }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Conveniences for text values.
  void set(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) {
    const Bytes value = get(key);
    return std::string(value.begin(), value.end());
  }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace datapar
