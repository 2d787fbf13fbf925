// TcpStoreServer. See tcp_store_server.h for the design, tcp_wire.h for the format.
#include "rendezvous/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <unordered_map>

#include "datapar/error.h"
#include "rendezvous/socket.h"
#include "rendezvous/tcp_wire.h"

namespace datapar::detail {
namespace {

using Clock = std::chrono::steady_clock;
using wire::Op;
using wire::Reader;
using wire::Status;
using wire::Writer;

struct Client {
  int fd = -1;
  bool greeted = false;       // hello accepted
  bool closing = false;       // close once the output is flushed
  bool broken = false;        // peer gone or protocol violated: close now
  Bytes in;                   // bytes received, not yet decoded
  Bytes out;                  // bytes to send
  // A kWait that is not satisfied yet: its keys and deadline.
  std::optional<std::vector<std::string>> waiting;
  Clock::time_point deadline;
};

}  // namespace

struct TcpStoreServer::State {
  std::string token;
  std::unordered_map<std::string, Bytes> table;
  std::list<Client> clients;

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return table.count(k) > 0; });
  }

  void reply(Client& c, const Writer& w) {
    const Bytes frame = w.frame();
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }

  // Answers every wait whose keys now all exist.
  void wake_waiters() {
    for (Client& c : clients) {
      if (c.waiting && has_all(*c.waiting)) {
        c.waiting.reset();
        reply(c, Writer().u8(static_cast<uint8_t>(Status::kOk)));
      }
    }
  }

  // Answers the waits whose deadline passed; returns the time to the next deadline.
  int expire_waits() {
    const auto now = Clock::now();
    int next = -1;
    for (Client& c : clients) {
      if (!c.waiting) continue;
      if (c.deadline <= now) {
        std::vector<std::string> missing;
        for (const std::string& k : *c.waiting) {
          if (!table.count(k)) missing.push_back(k);
        }
        c.waiting.reset();
        reply(c, Writer().u8(static_cast<uint8_t>(Status::kTimeout)).strs(missing));
      } else {
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now).count();
        next = next < 0 ? static_cast<int>(ms) : std::min(next, static_cast<int>(ms));
      }
    }
    return next;
  }

  // Decodes and serves one frame body; false means: close this connection.
  bool serve(Client& c, const uint8_t* body, uint32_t size) {
    Reader r(body, size);
    if (!c.greeted) {
      char magic[4];
      for (char& m : magic) m = static_cast<char>(r.u8());
      const uint8_t version = r.u8();
      const std::string presented = r.str();
      if (!r.done() || std::memcmp(magic, wire::kMagic, 4) != 0 || version != wire::kVersion) return false;
      if (presented != token) {
        reply(c, Writer().u8(static_cast<uint8_t>(Status::kRefused))
                     .str("the store token does not match this job's"));
        c.closing = true;
        return true;
      }
      c.greeted = true;
      reply(c, Writer().u8(static_cast<uint8_t>(Status::kOk)));
      return true;
    }
    if (c.waiting) return false;  // one request at a time
    const auto op = static_cast<Op>(r.u8());
    Writer w;
    const auto ok = [&]() -> Writer& { return w.u8(static_cast<uint8_t>(Status::kOk)); };
    switch (op) {
      case Op::kSet: {
        std::string key = r.str();
        Bytes value = r.bytes();
        if (!r.done()) return false;
        table[std::move(key)] = std::move(value);
        reply(c, ok());
        wake_waiters();
        return true;
      }
      case Op::kGet: {
        const std::string key = r.str();
        if (!r.done()) return false;
        auto it = table.find(key);
        if (it == table.end()) {
          reply(c, w.u8(static_cast<uint8_t>(Status::kNotFound)));
        } else {
          reply(c, ok().bytes(it->second));
        }
        return true;
      }
      case Op::kAdd: {
        const std::string key = r.str();
        const int64_t delta = r.i64();
        if (!r.done()) return false;
        int64_t value = 0;
        auto it = table.find(key);
        if (it != table.end()) {
          const std::string text(it->second.begin(), it->second.end());
          char* end = nullptr;
          errno = 0;
          value = std::strtoll(text.c_str(), &end, 10);
          if (text.empty() || errno != 0 || *end != '\0') {
            reply(c, w.u8(static_cast<uint8_t>(Status::kError)).str("key \"" + key + "\" does not hold an integer"));
            return true;
          }
        }
        value += delta;
        const std::string text = std::to_string(value);
        table[key] = Bytes(text.begin(), text.end());
        reply(c, ok().i64(value));
        wake_waiters();
        return true;
      }
      case Op::kCompareSet: {
        const std::string key = r.str();
        const Bytes expected = r.bytes();
        Bytes desired = r.bytes();
        if (!r.done()) return false;
        auto it = table.find(key);
        if (it == table.end()) {
          if (expected.empty()) {
            table[key] = desired;
            reply(c, ok().bytes(desired));
            wake_waiters();
          } else {
            reply(c, ok().bytes(expected));
          }
        } else {
          if (it->second == expected) it->second = std::move(desired);
          reply(c, ok().bytes(it->second));
        }
        return true;
      }
      case Op::kWait: {
        std::vector<std::string> keys = r.strs();
        const int64_t ms = r.i64();
        if (!r.done()) return false;
        if (has_all(keys)) {
          reply(c, ok());
        } else {
          c.waiting = std::move(keys);
          c.deadline = Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, int64_t{1} << 40));
        }
        return true;
      }
      case Op::kCheck: {
        const std::vector<std::string> keys = r.strs();
        if (!r.done()) return false;
        reply(c, ok().u8(has_all(keys) ? 1 : 0));
        return true;
      }
      case Op::kDelete: {
        const std::string key = r.str();
        if (!r.done()) return false;
        reply(c, ok().u8(table.erase(key) ? 1 : 0));
        return true;
      }
      case Op::kNumKeys: {
        if (!r.done()) return false;
        reply(c, ok().i64(static_cast<int64_t>(table.size())));
        return true;
      }
    }
    return false;  // unknown op
  }

  // Serves every complete frame in c.in; false means: close this connection.
  bool drain(Client& c) {
    size_t used = 0;
    bool keep = true;
    while (keep && !c.closing && c.in.size() - used >= 4) {
      const uint32_t n = wire::frame_length(c.in.data() + used);
      if (n > wire::kMaxFrameBytes) return false;
      if (c.in.size() - used - 4 < n) break;
      keep = serve(c, c.in.data() + used + 4, n);
      used += 4 + n;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(used));
    return keep;
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, std::string token)
    : state_(std::make_unique<State>()) {
  state_->token = std::move(token);
  listen_fd_ = listen_tcp(host, port, &port_);
  if (::pipe2(stop_fds_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw Error(str_cat("TcpStore: cannot create the server's wake-up pipe: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { loop(); });
}

void TcpStoreServer::flush_all() {
  for (Client& c : state_->clients) {
    if (c.broken || c.out.empty()) continue;
    const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(c.out.begin(), c.out.begin() + n);
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      c.broken = true;
    }
  }
}

TcpStoreServer::~TcpStoreServer() {
  const char byte = 0;
  (void)::write(stop_fds_[1], &byte, 1);
  thread_.join();
  for (Client& c : state_->clients) ::close(c.fd);
  ::close(listen_fd_);
  ::close(stop_fds_[0]);
  ::close(stop_fds_[1]);
}

void TcpStoreServer::loop() {
  State& s = *state_;
  std::vector<pollfd> fds;
  std::vector<Client*> order;
  for (;;) {
    const int timeout = s.expire_waits();
    fds.assign({pollfd{stop_fds_[0], POLLIN, 0}, pollfd{listen_fd_, POLLIN, 0}});
    order.clear();
    for (Client& c : s.clients) {
      fds.push_back(pollfd{c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      order.push_back(&c);
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready < 0 && errno != EINTR) return;
    if (fds[0].revents) {  // stop requested: hand out the replies already decided first
      flush_all();
      return;
    }
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        s.clients.push_back(Client{});
        s.clients.back().fd = fd;
      }
    }
    for (size_t i = 0; i < order.size(); ++i) {
      Client& c = *order[i];
      const short events = fds[i + 2].revents;
      bool keep = !(events & (POLLERR | POLLNVAL));
      if (keep && (events & (POLLIN | POLLHUP))) {
        uint8_t buffer[65536];
        for (;;) {
          const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
          if (n > 0) {
            c.in.insert(c.in.end(), buffer, buffer + n);
            if (c.in.size() > wire::kMaxFrameBytes + 4) break;  // drain() refuses it
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) keep = false;  // peer gone
          break;
        }
        if (!c.in.empty() && !s.drain(c)) keep = false;
      }
      if (!keep) c.broken = true;
    }
    // Replies go out after every request of this pass was served: one served late in the
    // pass may have woken a waiter served earlier in it.
    flush_all();
    for (auto it = s.clients.begin(); it != s.clients.end();) {
      if (it->broken || (it->closing && it->out.empty())) {
        ::close(it->fd);
        it = s.clients.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace datapar::detail
