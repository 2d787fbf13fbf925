// StoreService: the TcpStore server's protocol, without sockets: the key-value table and,
// for each connection, the hello, the framing, the requests, the waits and the output.
//
// The poll loop (tcp_store_server.cc) hands it the bytes each connection received and sends
// what it queues; a fuzzer (fuzz/store_server_fuzz.cc) does the same from its input. Every
// input costs bounded memory before the hello (Note [Strangers]), and a client's queued
// output is bounded by stopping to read it (want() == 0) until it drains.
//
// Note [Strangers]: a connection that has not completed the handshake (Note [Handshake] in
// store_handshake.h) is a stranger. It may buffer at most one frame of kMaxHelloBytes + 4
// bytes; a frame announcing more is refused on its length alone. It must complete the
// handshake within hello_timeout, and at most
// max_strangers exist at once: a new one drops the oldest. So strangers cost the server
// at most max_strangers descriptors and a few hundred bytes each, however many come.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "datapar/rendezvous/store.h"

namespace datapar::detail {

struct StoreLimits {
  // Time a new connection gets to complete the handshake.
  std::chrono::milliseconds hello_timeout = std::chrono::seconds(5);
  // Strangers (connections before their hello) at once; one more drops the oldest.
  size_t max_strangers = 128;
  // Output queued for one client above which its requests are not read until it drains.
  size_t max_output_bytes = 1u << 20;
};

class StoreService {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  // Clients must prove that they know `token` and belong to the run `run_id` (Note
  // [Handshake]). `make_nonce` gives the server's nonces (null: fresh random ones; a fuzzer
  // gives fixed ones, to reach past the handshake).
  StoreService(std::string token, const std::string& run_id, StoreLimits limits = {},
               std::function<Bytes()> make_nonce = nullptr);

  // A new connection, accepted at `now`. Beyond max_strangers it drops the oldest stranger
  // (its done() turns true).
  Id connect(Clock::time_point now);
  // How many bytes to read from `id` now; 0: do not read it until output drains or its wait ends.
  size_t want(Id id) const;
  // Bytes read from `id` (at most want(id)): serves every request they complete.
  void receive(Id id, const uint8_t* data, size_t size, Clock::time_point now);
  // The connection is gone (peer closed, or the caller closed it): forgets it.
  void disconnect(Id id);

  // The bytes queued for `id` and not sent yet; sent() says how many of them went out.
  std::pair<const uint8_t*, size_t> output(Id id) const;
  void sent(Id id, size_t n, Clock::time_point now);
  // Whether to close `id` now: it broke the protocol, was refused (answer sent), was
  // dropped as the oldest stranger, or missed its hello deadline.
  bool done(Id id) const;

  // Answers the waits and drops the strangers whose deadline passed; returns the next
  // deadline, if any.
  std::optional<Clock::time_point> expire(Clock::time_point now);

  size_t connections() const { return connections_.size(); }
  size_t strangers() const { return strangers_; }
  size_t keys() const { return table_.size(); }

 private:
  enum class Fate { kOpen, kCloseAfterOutput, kClose };
  struct Connection {
    bool greeted = false;  // completed the handshake: no longer a stranger
    Bytes expected_proof;  // after the hello: the client's proof it must send next
    Fate fate = Fate::kOpen;
    Bytes in;              // received, not served yet (at most one frame plus one read)
    size_t in_used = 0;    // bytes of `in` already served
    Bytes out;             // queued replies
    size_t out_sent = 0;   // bytes of `out` already sent
    Clock::time_point hello_deadline;
    // A kWait not satisfied yet: its keys and deadline.
    std::optional<std::vector<std::string>> waiting;
    Clock::time_point wait_deadline;
  };

  bool blocked(const Connection& c) const;
  void close(Id id, Connection& c);
  void reply(Connection& c, const Bytes& frame);
  void process(Id id, Connection& c);  // serves what `in` holds, while not blocked
  bool serve(Id id, Connection& c, const uint8_t* body, uint32_t size);  // false: close it
  bool serve_hello(Connection& c, const uint8_t* body, uint32_t size);
  bool serve_proof(Connection& c, const uint8_t* body, uint32_t size);
  void refuse(Connection& c, const std::string& why);  // answers kRefused, closes after
  bool has_all(const std::vector<std::string>& keys) const;
  void wake_waiters();
  void run_ready();  // processes the connections a wake-up unblocked

  std::string token_;
  Bytes run_digest_;
  StoreLimits limits_;
  std::function<Bytes()> make_nonce_;
  std::unordered_map<std::string, Bytes> table_;
  std::unordered_map<Id, Connection> connections_;
  Id next_id_ = 1;
  std::deque<Id> stranger_order_;  // oldest first; may hold ids greeted or gone since
  size_t strangers_ = 0;
  std::set<std::pair<Clock::time_point, Id>> waits_;
  std::vector<Id> ready_;  // unblocked, with input left to serve
  Clock::time_point now_;
};

}  // namespace datapar::detail
