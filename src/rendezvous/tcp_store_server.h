// The TcpStore server: the poll() loop that serves a StoreService (store_service.h) over TCP.
//
// One thread, one poll() loop over non-blocking sockets, so no client can stall another.
// The service decides what each connection may send and what it is answered; this loop
// only moves bytes: it reads from a connection no more than the service wants (a stranger:
// one hello at most), sends what it queued, and closes what it is done with. Waits are
// kept with their deadlines, so a waiting client gets a kTimeout reply on time.
// Out of descriptors (accept4 fails with EMFILE), it stops accepting for a moment rather
// than spin on a listening socket that stays readable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace datapar::detail {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: a free port, see port()) and serves on a thread of its
  // own until destroyed. Clients must prove that they know `token`, which must not be
  // empty, and belong to the run `run_id` (Note [Handshake]). With `publish`, the token is
  // written where this user's processes find it (store_token.h) before the server listens,
  // and removed when it stops.
  // Throws InvalidArgumentError when it cannot listen.
  TcpStoreServer(const std::string& host, uint16_t port, std::string token, std::string run_id, bool publish = false);
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  void loop();

  std::string token_;
  std::string run_id_;
  bool published_ = false;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int stop_fds_[2] = {-1, -1};  // a pipe: the destructor writes to wake the loop
  std::thread thread_;
};

}  // namespace datapar::detail
