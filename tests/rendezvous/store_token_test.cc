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
#include <thread>

#include "datapar/error.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/expect_throw.h"
#include "testing/raw_handshake.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// The server's verdict on a client that knows `token` (0 accepted, 1 refused, -1 none).
int hello_status(uint16_t port, const std::string& token, const std::string& run_id = "") {
  const int fd = connect_to(port);
  const int status = testing::raw_handshake(fd, token, run_id);
  ::close(fd);
  return status;
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

// Issue 27: a local process that took the store's port first received every rank's hello
// with the job's token in clear. Now a client sends nonces and proofs only, and leaves a
// server that cannot prove it knows the token, saying so.
TEST(TcpStoreHandshake, TheTokenNeverCrossesTheWire) {
  const std::string token = "never-on-the-wire-7f3a";
  const testing::LoopbackListener listener;
  // The impostor answers the hello as a store would, with a proof it cannot make.
  std::string seen;
  std::thread impostor([&] {
    const int fd = ::accept(listener.fd, nullptr, nullptr);
    if (fd < 0) return;
    if (const auto hello = testing::read_frame(fd)) seen.assign(hello->begin(), hello->end());
    const Bytes answer = detail::wire::Writer()
                             .u8(0)
                             .bytes(Bytes(detail::handshake::kNonceBytes, 1))
                             .bytes(Bytes(detail::handshake::kDigestBytes, 2))
                             .frame();
    (void)::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
    if (const auto more = testing::read_frame(fd)) seen.append(more->begin(), more->end());
    ::close(fd);
  });
  EXPECT_THROW_MSG(TcpStore({"127.0.0.1", listener.port, false, token, 10s}), InvalidArgumentError,
                   "does not share this process's store token");
  impostor.join();
  EXPECT_FALSE(seen.empty()) << "the client sent no hello";
  EXPECT_EQ(seen.find(token), std::string::npos) << "the token crossed the wire";
  EXPECT_EQ(seen.find("never-on"), std::string::npos);
}

// Issue 27: a store serves the clients of its own run only; another job's are refused at
// once, with what to do, even when both jobs have the same token.
TEST(TcpStoreHandshake, AStoreServesItsOwnRunOnly) {
  TcpStoreOptions mine{"127.0.0.1", 0, true, "shared", 10s};
  mine.run_id = "job-a";
  TcpStore server(mine);
  TcpStoreOptions theirs{"127.0.0.1", server.port(), false, "shared", 10s};
  theirs.run_id = "job-b";
  EXPECT_THROW_MSG(TcpStore{theirs}, InvalidArgumentError, "this store belongs to another job");
  EXPECT_EQ(hello_status(server.port(), "shared", "job-b"), 1);
  theirs.run_id = "job-a";
  TcpStore client(theirs);
  client.set("k", "v");
  EXPECT_EQ(server.get_string("k"), "v");
  EXPECT_EQ(hello_status(server.port(), "shared", "job-a"), 0);
}

// A client of protocol version 1 (the token in clear) is answered with what is wrong.
TEST(TcpStoreHandshake, AnOldClientIsToldToRunTheSameDatapar) {
  TcpStore server({"127.0.0.1", 0, true, "s3cret", 10s});
  const int fd = connect_to(server.port());
  const Bytes old_hello = detail::wire::Writer().u8('D').u8('P').u8('S').u8('T').u8(1).str("s3cret").frame();
  ASSERT_EQ(::send(fd, old_hello.data(), old_hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(old_hello.size()));
  const auto answer = testing::read_frame(fd);
  ::close(fd);
  ASSERT_TRUE(answer.has_value());
  ASSERT_FALSE(answer->empty());
  EXPECT_EQ((*answer)[0], 1);
  EXPECT_NE(std::string(answer->begin(), answer->end()).find("run the same datapar"), std::string::npos);
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
