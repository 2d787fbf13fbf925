// The store's protocol over raw sockets, for tests that speak it byte by byte: the client's
// side of the handshake (Note [Handshake] in src/rendezvous/store_handshake.h) for
// strangers, half hellos and clients that never read, and a listening socket for fake
// servers.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "rendezvous/store_handshake.h"
#include "rendezvous/tcp_wire.h"

namespace datapar::testing {

// A socket listening on 127.0.0.1, at a port the kernel chose: a fake server's.
struct LoopbackListener {
  LoopbackListener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      throw std::runtime_error("LoopbackListener: cannot listen on 127.0.0.1");
    }
    port = ntohs(addr.sin_port);
  }
  ~LoopbackListener() { ::close(fd); }
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;

  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
};

// One frame's body from `fd` within 5 s, or nullopt.
inline std::optional<Bytes> read_frame(int fd) {
  auto read_exactly = [fd](uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      const ssize_t r = ::recv(fd, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  uint8_t header[4];
  if (!read_exactly(header, 4)) return std::nullopt;
  Bytes body(detail::wire::frame_length(header));
  if (body.size() > (1u << 20) || !read_exactly(body.data(), body.size())) return std::nullopt;
  return body;
}

// A version-2 hello: a fresh nonce and the digest of `run_id`.
inline Bytes hello_bytes(const std::string& run_id = "") {
  return detail::wire::hello_frame(detail::handshake::fresh_nonce(), detail::handshake::run_digest(run_id));
}

// Completes the handshake as a client knowing `token` (of run `run_id`) on the connected
// socket `fd`. Returns the server's last status (0: accepted; 1: refused, at the hello or
// the proof), or -1 when an answer did not come or did not decode.
inline int raw_handshake(int fd, const std::string& token, const std::string& run_id = "") {
  namespace hs = detail::handshake;
  const Bytes nonce = hs::fresh_nonce();
  const Bytes run = hs::run_digest(run_id);
  const Bytes hello = detail::wire::hello_frame(nonce, run);
  if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) return -1;
  const auto answer = read_frame(fd);
  if (!answer || answer->empty()) return -1;
  if ((*answer)[0] != 0) return (*answer)[0];
  detail::wire::Reader r(answer->data() + 1, answer->size() - 1);
  const Bytes server_nonce = r.bytes();
  (void)r.bytes();  // the server's proof: not checked here
  if (!r.done()) return -1;
  const Bytes proof = detail::wire::proof_frame(hs::proof(token, hs::Side::kClient, nonce, server_nonce, run));
  if (::send(fd, proof.data(), proof.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(proof.size())) return -1;
  const auto verdict = read_frame(fd);
  return verdict && !verdict->empty() ? (*verdict)[0] : -1;
}

}  // namespace datapar::testing
