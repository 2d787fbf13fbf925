// TcpStore: a Store served over TCP, for rendezvous between processes on one or many hosts.
//
// One process hosts the server (rank 0, with is_server, or a standalone one); every
// process, the host included, talks to it as a client. Clients retry connecting with
// backoff until the timeout, so start order does not matter. On connect, client and server
// prove to each other that they know the job's token (from the launcher through
// DATAPAR_STORE_TOKEN, or generated for a job on one machine) and have the same run id,
// without sending the token (Note [Handshake] in src/rendezvous/store_handshake.h): a client
// of another job, or one without the token, is refused with InvalidArgumentError, and so is
// a server that cannot prove it. Strangers cost the server little: see the limits in
// docs/store_protocol.md, which has the wire format.
//
//   datapar::TcpStore store({.host = "10.0.0.1", .port = 29500, .is_server = rank == 0});
//   store.set("ready/" + std::to_string(rank), "1");
//   store.wait({"ready/0", "ready/1"});
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "datapar/rendezvous/store.h"

namespace datapar {
namespace detail {
class TcpStoreServer;
namespace wire {
enum class Op : uint8_t;
struct Reply;
}  // namespace wire
}  // namespace detail

struct TcpStoreOptions {
  // The server's address. With is_server, the address the server listens on.
  std::string host = "127.0.0.1";
  // The server's port. With is_server, 0 takes any free port (read it back with port()).
  uint16_t port = 0;
  // Host the server in this process (it stops when this TcpStore is destroyed).
  bool is_server = false;
  // Shared secret every client must present (at most 256 bytes). rendezvous() passes
  // DATAPAR_STORE_TOKEN (JobConfig::store_token); the store itself reads no environment.
  // Empty: the server makes a random one and shares it with the processes of this machine
  // and user only, through a file only they can read; a client on another machine is then
  // refused at once.
  std::string token;
  // Limit for connecting and for every wait.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // The job's identity: a server serves clients of its own run id only, so two jobs that
  // meet on one port (with one token) never join each other. rendezvous() passes
  // JobConfig::run_id (DATAPAR_RUN_ID, which datapar launch sets).
  std::string run_id;
};

// A fresh random store token (32 hex digits), for launchers that hand one to their workers.
std::string make_store_token();

class TcpStore : public Store {
 public:
  // Starts the server (with is_server) and connects to it. Throws InvalidArgumentError if
  // the server cannot listen (port in use) or refuses the token, TimeoutError if no server
  // answers within the timeout.
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  // Every call is thread-safe and throws CommError if the connection to the server breaks.
  // One connection serves one request at a time: a wait() holds it until it returns, so
  // threads that wait independently should each have their own TcpStore.
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

  // A client of the same server, with the same token and run id (Store::clone).
  std::shared_ptr<Store> clone(std::chrono::milliseconds timeout) const override;
  std::string address() const override { return where(); }

  // The server's port (the one the server took, when it was asked for port 0).
  uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  enum class Exchange { kOk, kClosed, kBroken, kMalformed, kTimeout };
  // Sends a request and reads its reply, without throwing.
  Exchange exchange(const Bytes& request, detail::wire::Op op, std::chrono::steady_clock::time_point deadline,
                    detail::wire::Reply* reply);
  // exchange() that throws CommError or TimeoutError when it fails.
  detail::wire::Reply call(const Bytes& request, detail::wire::Op op, std::chrono::milliseconds reply_timeout);
  [[noreturn]] void fail(Exchange result, const char* what, std::chrono::milliseconds reply_timeout);
  // Note [Handshake] on the connection fd_: kOk, or why it did not complete (kClosed: the
  // server closed it before answering, as it does to the oldest strangers of a flood).
  // Throws InvalidArgumentError when either side refuses the other.
  Exchange handshake(std::chrono::steady_clock::time_point deadline);
  std::string where() const;

  std::string host_;
  std::string connect_host_;  // host_, or loopback for a server on every address
  uint16_t port_ = 0;
  std::string token_;         // as given, or the one generated or read (Note [Token])
  std::string run_id_;
  std::unique_ptr<detail::TcpStoreServer> server_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace datapar
