// TcpStoreServer. See tcp_store_server.h for the design, store_service.h for the protocol.
#include "rendezvous/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "datapar/error.h"
#include "rendezvous/socket.h"
#include "rendezvous/store_service.h"
#include "rendezvous/store_token.h"

namespace datapar::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Connections accepted per pass: fewer than StoreLimits::max_strangers, so a client
// accepted in one pass is read in the next before a flood of newcomers can drop it.
constexpr int kAcceptBatch = 32;
// Bytes read from one connection per pass, so one busy client cannot starve the others.
constexpr size_t kReadPerPass = 256u << 10;
// How long to stop accepting when this process is out of descriptors.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

struct Connection {
  int fd;
  StoreService::Id id;
};

// Milliseconds from now to `until` for poll(): 0 if past, and never beyond an int.
int poll_timeout(Clock::time_point now, Clock::time_point until) {
  if (until <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, std::string token, std::string run_id,
                               bool publish)
    : token_(std::move(token)), run_id_(std::move(run_id)) {
  DATAPAR_INTERNAL_ASSERT(!token_.empty(), "a store server without a token");
  try {
    listen_fd_ = listen_tcp(host, port, &port_, [&](uint16_t bound) {
      // Before listening: a client that connects finds the token already there.
      if (publish) publish_local_token(bound, token_);
      published_ = publish;
    });
  } catch (...) {
    if (published_) remove_local_token(port_, token_);
    throw;
  }
  if (::pipe2(stop_fds_, O_CLOEXEC) != 0) {
    if (published_) remove_local_token(port_, token_);
    ::close(listen_fd_);
    throw Error(str_cat("TcpStore: cannot create the server's wake-up pipe: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char byte = 0;
  (void)::write(stop_fds_[1], &byte, 1);
  thread_.join();
  // Before the port is free again: a later server on it publishes its own token.
  if (published_) remove_local_token(port_, token_);
  ::close(listen_fd_);
  ::close(stop_fds_[0]);
  ::close(stop_fds_[1]);
}

void TcpStoreServer::loop() {
  StoreService service(token_, run_id_);
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  std::vector<uint8_t> buffer(64u << 10);
  Clock::time_point accept_paused_until{};

  // Sends what it can of every connection's output, without blocking.
  auto flush_all = [&](Clock::time_point now) {
    for (const Connection& c : connections) {
      const auto [data, size] = service.output(c.id);
      if (size == 0) continue;
      const ssize_t n = ::send(c.fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        service.sent(c.id, static_cast<size_t>(n), now);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        service.disconnect(c.id);  // peer gone; done() is now true
      }
    }
  };
  auto close_done = [&] {
    auto gone = std::remove_if(connections.begin(), connections.end(), [&](const Connection& c) {
      if (!service.done(c.id)) return false;
      ::close(c.fd);
      service.disconnect(c.id);
      return true;
    });
    connections.erase(gone, connections.end());
  };

  for (;;) {
    Clock::time_point now = Clock::now();
    std::optional<Clock::time_point> wake = service.expire(now);
    flush_all(now);
    close_done();
    const bool accepting = now >= accept_paused_until;
    if (!accepting && (!wake || accept_paused_until < *wake)) wake = accept_paused_until;

    fds.assign({pollfd{stop_fds_[0], POLLIN, 0}, pollfd{listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0}});
    for (const Connection& c : connections) {
      short events = POLLRDHUP;  // a peer that leaves is noticed even when it is not read
      if (service.want(c.id) > 0) events |= POLLIN;
      if (service.output(c.id).second > 0) events |= POLLOUT;
      fds.push_back(pollfd{c.fd, events, 0});
    }
    const int ready = ::poll(fds.data(), fds.size(), wake ? poll_timeout(now, *wake) : -1);
    if (ready < 0 && errno != EINTR) return;
    now = Clock::now();
    if (fds[0].revents) {  // stop requested: hand out the replies already decided first
      flush_all(now);
      for (const Connection& c : connections) ::close(c.fd);
      return;
    }

    const size_t polled = connections.size();  // those accepted below are polled next pass
    if (fds[1].revents & POLLIN) {
      for (int i = 0; i < kAcceptBatch; ++i) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          connections.push_back(Connection{fd, service.connect(now)});
          continue;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The connection stays in the backlog and the socket readable: polling it now
          // would spin. Try again shortly; the cap on strangers keeps them from causing this.
          accept_paused_until = now + kAcceptPause;
        }
        if (errno != ECONNABORTED && errno != EINTR) break;  // EAGAIN: none left
      }
    }

    for (size_t i = 0; i < polled; ++i) {
      const Connection& c = connections[i];
      const short events = fds[i + 2].revents;
      bool gone = (events & (POLLERR | POLLNVAL)) != 0;
      size_t budget = kReadPerPass;
      if (!gone && (events & POLLIN)) {
        for (size_t want; budget > 0 && (want = service.want(c.id)) > 0;) {
          const ssize_t n = ::recv(c.fd, buffer.data(), std::min({want, budget, buffer.size()}), 0);
          if (n > 0) {
            service.receive(c.id, buffer.data(), static_cast<size_t>(n), now);
            budget -= static_cast<size_t>(n);
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) gone = true;  // peer gone
          if (n == 0 || errno != EINTR) break;
        }
      } else if (events & (POLLHUP | POLLRDHUP)) {
        gone = true;  // left while we were not reading it (blocked on output or a wait)
      }
      if (gone) service.disconnect(c.id);
    }
    // Replies go out after every request of this pass was served: one served late in the
    // pass may have woken a waiter served earlier in it.
    flush_all(now);
    close_done();
  }
}

}  // namespace datapar::detail
