// See socket.h.
#include "rendezvous/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "datapar/error.h"

namespace datapar::detail {
namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

int resolve(const std::string& host, uint16_t port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
}

std::string address(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

// A socket bound to host:port with SO_REUSEADDR (port 0: any free port), not listening; -1
// with `error` set when no address of host could be bound.
int bind_tcp(const std::string& host, uint16_t port, uint16_t* bound_port, std::string* error) {
  AddrInfo info;
  const int rc = resolve(host, port, /*passive=*/true, &info);
  DATAPAR_CHECK(rc == 0, "TcpStore: cannot listen on ", address(host, port), ": ", gai_strerror(rc),
                ". Give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0.");
  *error = "no address";
  for (addrinfo* a = info.list; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      *bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      return fd;
    }
    *error = std::strerror(errno);
    ::close(fd);
  }
  return -1;
}

}  // namespace

void set_nonblocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

int listen_tcp(const std::string& host, uint16_t port, uint16_t* bound_port,
               const std::function<void(uint16_t port)>& before_listen) {
  std::string error;
  const int fd = bind_tcp(host, port, bound_port, &error);
  if (fd >= 0) {
    try {
      if (before_listen) before_listen(*bound_port);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (listen(fd, 1024) == 0) {
      set_nonblocking(fd, true);
      return fd;
    }
    error = std::strerror(errno);
    ::close(fd);
  }
  throw InvalidArgumentError(str_cat("TcpStore: cannot listen on ", address(host, port), ": ", error,
                                     ". If the port is in use (another job, or an earlier one still exiting), ",
                                     "pick another port (MASTER_PORT) or let the server take a free one (port 0)."));
}

int reserve_tcp_port(const std::string& host, uint16_t* port) {
  std::string error;
  const int fd = bind_tcp(host, 0, port, &error);
  DATAPAR_CHECK(fd >= 0, "cannot reserve a port on ", host, ": ", error,
                ". Give an address of this machine (--master-addr), e.g. 127.0.0.1.");
  return fd;
}

int connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout, const char* who) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(10);
  std::string last_error = "timed out";
  for (;;) {
    AddrInfo info;
    const int rc = resolve(host, port, /*passive=*/false, &info);
    if (rc != 0) {
      last_error = gai_strerror(rc);
    } else {
      for (addrinfo* a = info.list; a != nullptr; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        // Non-blocking connect, so an unreachable host costs at most the time left.
        set_nonblocking(fd, true);
        int result = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (result != 0 && errno == EINPROGRESS) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          pollfd p{fd, POLLOUT, 0};
          if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) == 1) {
            int error = 0;
            socklen_t len = sizeof(error);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
            result = error == 0 ? 0 : -1;
            errno = error;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (result == 0) {
          set_nonblocking(fd, false);
          const int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  throw TimeoutError(str_cat(who, ": no reply from ", address(host, port), " after ",
                             std::chrono::duration<double>(timeout).count(), " s (", last_error,
                             "). Is the store server (rank 0) running? Start it first or raise the timeout."));
}

ssize_t recv_some(int fd, uint8_t* data, size_t size, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return -2;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return -1;
    if (ready == 0) return -2;
    const ssize_t n = ::recv(fd, data, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return n;
  }
}

bool send_all(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace datapar::detail
