// Ports for tests, without the race of probing for a free one and releasing it (another
// process, e.g. a test running beside this one, could bind it in between).
//
// - ThreadJobStore: ranks that are threads of the test. Rank 0's server binds port 0 and
//   the other ranks connect to the port it got.
// - ReservedPort: for the few tests that must name a port before any server starts,
//   because what they test takes it from a URL or MASTER_PORT (tcp:// and env://
//   rendezvous, `datapar train` under torchrun's variables): every rank needs the number
//   up front, and rank 0 binds it itself.
// Multi-process jobs whose store is not what they test need no port: they rendezvous
// through a FileStore (file://) in a testing::TempDir, as ddp_test does.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>

#include "datapar/error.h"
#include "datapar/rendezvous/tcp_store.h"

namespace datapar::testing {

// The store of a job whose ranks are threads of one test: rank 0 hosts the TcpStore server
// on 127.0.0.1 port 0; the other ranks wait for the port it got and connect to it.
class ThreadJobStore {
 public:
  explicit ThreadJobStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // Rank `rank`'s connection; rank 0's also hosts the server, which stops when rank 0 lets
  // go of it. Rank 0 must call it exactly once. Thread-safe. Throws what rank 0's TcpStore
  // threw, on every rank; TimeoutError when rank 0 does not start within the timeout.
  std::shared_ptr<TcpStore> join(int rank) {
    if (rank == 0) {
      try {
        auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, "", timeout_});
        port_.set_value(server->port());
        return server;
      } catch (...) {
        port_.set_exception(std::current_exception());
        throw;
      }
    }
    if (server_port_.wait_for(timeout_) != std::future_status::ready) {
      throw TimeoutError("ThreadJobStore: rank " + std::to_string(rank) + " waited for rank 0's store server, " +
                         "which did not start within the timeout");
    }
    return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", server_port_.get(), false, "", timeout_});
  }

 private:
  std::chrono::milliseconds timeout_;
  std::promise<uint16_t> port_;
  std::shared_future<uint16_t> server_port_ = port_.get_future().share();
};

// A port on 127.0.0.1 that no other process can take while this object lives, yet a
// TcpStore server can bind and listen on. It holds a socket bound to port 0 with
// SO_REUSEADDR and never listens on it: the kernel gives a port that has a bound socket to
// no bind(0) or connect() elsewhere, and Linux lets another SO_REUSEADDR socket (our
// server's, src/rendezvous/socket.cc) listen beside one that does not. Until a server
// listens, connecting to it is refused. Programs the test starts do not inherit the
// socket (SOCK_CLOEXEC): the reservation ends with this object.
class ReservedPort {
 public:
  // Throws std::runtime_error when no socket can be bound.
  ReservedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail("socket");
    const int one = 1;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) fail("setsockopt");
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) fail("bind");
    if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) fail("getsockname");
    number_ = ntohs(address.sin_port);
  }
  ~ReservedPort() { ::close(fd_); }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  uint16_t number() const { return number_; }

 private:
  [[noreturn]] void fail(const char* call) {
    const std::string reason = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error(std::string("ReservedPort: ") + call + " failed: " + reason);
  }

  int fd_ = -1;
  uint16_t number_ = 0;
};

}  // namespace datapar::testing
