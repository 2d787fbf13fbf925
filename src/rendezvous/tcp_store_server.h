// The TcpStore server: the key-value table and the loop that serves it over TCP.
//
// One thread, one poll() loop over non-blocking sockets, so no client can stall another:
// a client that sends half a frame and goes quiet just holds its own buffer, and one that
// sends garbage (bad hello, wrong token, oversized or malformed frame) is disconnected.
// Waits are kept on the server with their deadlines, so a waiting client gets a kTimeout
// reply on time and the connection stays in step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace datapar::detail {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: a free port, see port()) and serves on a thread of its
  // own until destroyed. Clients must present `token` (empty: any client is accepted).
  // Throws InvalidArgumentError when it cannot listen.
  TcpStoreServer(const std::string& host, uint16_t port, std::string token);
  ~TcpStoreServer();

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  struct State;
  void loop();
  // Sends what it can of every connection's pending output, without blocking; marks the
  // connections whose send failed for closing.
  void flush_all();

  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int stop_fds_[2] = {-1, -1};  // a pipe: the destructor writes to wake the loop
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace datapar::detail
