// ReservedPort: a launcher's choice of MASTER_PORT stays free for rank 0 and for no one else.
#include "datapar/rendezvous/reserved_port.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <vector>

#include "datapar/error.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Binds a socket to 127.0.0.1:port (0: any) as an unrelated program would, without
// SO_REUSEADDR. Returns the socket (or -1, errno set) and the port it got.
int plain_bind(uint16_t port, uint16_t* got = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != nullptr) *got = ntohs(address.sin_port);
  return fd;
}

TEST(ReservedPort, NoOtherProgramGetsThePortButRankZerosStoreDoes) {
  const ReservedPort reserved("127.0.0.1");
  ASSERT_GT(reserved.port(), 0);

  // Asked for by number, as a program with its own port in mind would.
  EXPECT_EQ(plain_bind(reserved.port()), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  // Handed out for port 0, as to any program that takes a free port.
  std::vector<int> taken;
  for (int i = 0; i < 500; ++i) {
    uint16_t got = 0;
    const int fd = plain_bind(0, &got);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    taken.push_back(fd);
    EXPECT_NE(got, reserved.port());
  }
  for (int fd : taken) ::close(fd);

  // Rank 0's store binds it and serves; clients reach it there.
  TcpStore server({"127.0.0.1", reserved.port(), true, "token", 10s});
  TcpStore client({"127.0.0.1", reserved.port(), false, "token", 10s});
  client.set("ready", Bytes{1});
  EXPECT_EQ(server.get("ready"), Bytes{1});
}

TEST(ReservedPort, ThePortIsFreeAgainOnceTheReservationEnds) {
  uint16_t port = 0;
  {
    const ReservedPort reserved("127.0.0.1");
    port = reserved.port();
  }
  const int fd = plain_bind(port);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  if (fd >= 0) ::close(fd);
}

TEST(ReservedPort, AnAddressOfAnotherMachineIsAClearError) {
  // 192.0.2.1 (TEST-NET-1) is nobody's address here.
  EXPECT_THROW_MSG(ReservedPort("192.0.2.1"), InvalidArgumentError,
                    "cannot reserve a port on 192.0.2.1: Cannot assign requested address");
}

}  // namespace
}  // namespace datapar
