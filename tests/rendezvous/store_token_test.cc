// The store token: a TcpStore never runs without one. A job that gives none gets a
// generated token, shared with the other processes of this machine through a file only
// this user can read (rendezvous/store_token.h); a job across machines must give one.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "datapar/error.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

std::string u32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// The server's answer to a hello presenting `token`: its status byte, or -1 if none came.
int hello_status(uint16_t port, const std::string& token) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = std::string("DPST") + '\x01' + u32(static_cast<uint32_t>(token.size())) + token;
  const std::string hello = u32(static_cast<uint32_t>(body.size())) + body;
  EXPECT_EQ(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
  unsigned char reply[5];
  const timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  const ssize_t n = ::recv(fd, reply, sizeof(reply), MSG_WAITALL);
  ::close(fd);
  return n == 5 ? reply[4] : -1;
}

// Finding: a store started without a token accepted anyone.
TEST(TcpStoreToken, NoTokenGivenMeansAGeneratedOneNotNone) {
  ::unsetenv("DATAPAR_STORE_TOKEN");
  TcpStore server({"127.0.0.1", 0, true, "", 10s});
  EXPECT_EQ(hello_status(server.port(), ""), 1) << "a hello without a token must be refused";
  // A process of this machine and user that was given no token either finds it.
  TcpStore client({"127.0.0.1", server.port(), false, "", 10s});
  client.set("k", "v");
  EXPECT_EQ(server.get_string("k"), "v");
}

TEST(TcpStoreToken, AGivenTokenIsRequired) {
  TcpStore server({"127.0.0.1", 0, true, "s3cret", 10s});
  EXPECT_EQ(hello_status(server.port(), "s3cret"), 0);
  EXPECT_EQ(hello_status(server.port(), "s3cre"), 1);
  EXPECT_EQ(hello_status(server.port(), "s3cretX"), 1);
  EXPECT_EQ(hello_status(server.port(), ""), 1);
  EXPECT_THROW_MSG(TcpStore({"127.0.0.1", 0, true, std::string(300, 't'), 1s}), InvalidArgumentError,
                   "at most 256 bytes");
}

}  // namespace
}  // namespace datapar
