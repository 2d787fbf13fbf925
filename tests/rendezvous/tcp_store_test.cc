#include "datapar/rendezvous/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "datapar/error.h"
#include "datapar/rendezvous/prefix_store.h"
#include "testing/expect_throw.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

TcpStoreOptions server_options(std::string token = "", std::chrono::milliseconds timeout = 10s) {
  return {"127.0.0.1", 0, true, std::move(token), timeout};
}

TcpStore make_server(std::string token = "", std::chrono::milliseconds timeout = 10s) {
  return TcpStore(server_options(std::move(token), timeout));
}

TcpStoreOptions client_of(const TcpStore& server, std::string token = "", std::chrono::milliseconds timeout = 10s) {
  return {"127.0.0.1", server.port(), false, std::move(token), timeout};
}

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// A raw connection to the server, for sending what a real client never would.
int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST(TcpStore, EveryOperation) {
  TcpStore server = make_server();
  EXPECT_NE(server.port(), 0);  // port 0 took a free one
  TcpStore client(client_of(server));
  client.set("a", "1");
  EXPECT_EQ(server.get_string("a"), "1");
  EXPECT_EQ(client.add("counter", 5), 5);
  EXPECT_EQ(server.add("counter", -2), 3);
  EXPECT_EQ(client.get_string("counter"), "3");
  // compare_set: missing key with empty expected sets it; a mismatch leaves it.
  EXPECT_EQ(client.compare_set("cas", {}, bytes("x")), bytes("x"));
  EXPECT_EQ(client.compare_set("cas", bytes("y"), bytes("z")), bytes("x"));
  EXPECT_EQ(client.compare_set("cas", bytes("x"), bytes("z")), bytes("z"));
  EXPECT_EQ(client.compare_set("absent", bytes("e"), bytes("d")), bytes("e"));
  EXPECT_FALSE(client.check({"absent"}));
  EXPECT_TRUE(client.check({"a", "cas"}));
  EXPECT_FALSE(client.check({"a", "absent"}));
  EXPECT_EQ(client.num_keys(), 3);
  EXPECT_TRUE(client.delete_key("a"));
  EXPECT_FALSE(client.delete_key("a"));
  EXPECT_EQ(client.num_keys(), 2);
  const Bytes binary{0, 255, 7, 0};
  client.set("bin", binary);
  EXPECT_EQ(server.get("bin"), binary);
  EXPECT_THROW_MSG(client.add("cas", 1), InvalidArgumentError, "does not hold an integer");
}

TEST(TcpStore, GetWaitsForAKeySetLater) {
  TcpStore server = make_server();
  std::thread writer([&] {
    TcpStore other(client_of(server));
    std::this_thread::sleep_for(50ms);
    other.set("late", "here");
  });
  TcpStore client(client_of(server));
  EXPECT_EQ(client.get_string("late"), "here");
  writer.join();
}

TEST(TcpStore, WaitTimesOutNamingTheMissingKeys) {
  TcpStore server = make_server();
  TcpStore client(client_of(server));
  client.set("present", "1");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW_MSG(client.wait({"present", "missing"}, 10ms), TimeoutError, "still missing: \"missing\"");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  client.set_timeout(10ms);
  EXPECT_THROW(client.get("missing"), TimeoutError);
}

TEST(TcpStore, SixtyFourClientsAddAtOnce) {
  TcpStore server = make_server();
  std::vector<std::thread> threads;
  for (int i = 0; i < 64; ++i) {
    threads.emplace_back([&] {
      TcpStore client(client_of(server));
      for (int k = 0; k < 10; ++k) client.add("sum", 1);
      client.add("done", 1);
      client.wait({"all_done"});
    });
  }
  while (server.check({"done"}) == false || std::stoll(server.get_string("done")) < 64) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(server.get_string("sum"), "640");
  server.set("all_done", "1");
  for (auto& t : threads) t.join();
}

TEST(TcpStore, ClientWithoutTheTokenIsRefused) {
  TcpStore server = make_server("s3cret");
  EXPECT_THROW_MSG(TcpStore(client_of(server, "wrong")), InvalidArgumentError, "does not share this process's store token");
  // Without one, a client of this machine looks for a generated token: this server has none.
  EXPECT_THROW_MSG(TcpStore(client_of(server, "")), InvalidArgumentError, "published none");
  TcpStore good(client_of(server, "s3cret"));
  good.set("k", "v");
  EXPECT_EQ(server.get_string("k"), "v");
}

TEST(TcpStore, GarbageAndHalfFramesNeverStallTheServer) {
  TcpStore server = make_server();
  // A client that sends half a frame and goes quiet (kept open throughout).
  const int quiet = raw_connect(server.port());
  const uint8_t half[] = {100, 0, 0, 0, 'D', 'P'};
  ASSERT_EQ(::send(quiet, half, sizeof(half), 0), static_cast<ssize_t>(sizeof(half)));
  // Garbage, an oversized length, and a bad hello: each connection is closed by the server.
  for (const std::string& junk : {std::string("GET / HTTP/1.1\r\n\r\n"), std::string("\xff\xff\xff\xff", 4),
                                  std::string("\x05\x00\x00\x00XXXXX", 9)}) {
    const int fd = raw_connect(server.port());
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    char buffer[16];
    // Closed with the rest unread: a reset rather than an orderly end.
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << "server should close on: " << junk;
    ::close(fd);
  }
  // Real clients are still served, promptly.
  TcpStore client(client_of(server));
  client.set("after", "ok");
  EXPECT_EQ(server.get_string("after"), "ok");
  ::close(quiet);
}

TEST(TcpStore, ClientsRetryUntilTheServerStarts) {
  // Find a free port, then start the server on it only after the client began connecting.
  uint16_t port;
  {
    TcpStore probe = make_server();
    port = probe.port();
  }
  std::thread late_server([port] {
    std::this_thread::sleep_for(300ms);
    TcpStore server({"127.0.0.1", port, true, "", 10s});
    server.wait({"hello"});
  });
  TcpStore client({"127.0.0.1", port, false, "", 10s});
  client.set("hello", "1");
  late_server.join();
}

TEST(TcpStore, NoServerIsATimeoutThatSaysWhatToDo) {
  uint16_t port;
  {
    TcpStore probe = make_server();
    port = probe.port();
  }
  EXPECT_THROW_MSG(TcpStore({"127.0.0.1", port, false, "", 200ms}), TimeoutError, "Is the store server (rank 0) running?");
}

TEST(TcpStore, ADeadServerFailsTheWaitersInsteadOfHanging) {
  auto server = std::make_unique<TcpStore>(server_options());
  TcpStore client(client_of(*server, "", 60s));
  std::thread killer([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW_MSG(client.wait({"never"}), CommError, "lost the connection");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  killer.join();
  EXPECT_THROW(client.set("x", "y"), CommError);
}

TEST(TcpStore, PortInUseIsAClearError) {
  TcpStore server = make_server();
  EXPECT_THROW_MSG(TcpStore({"127.0.0.1", server.port(), true, "", 1s}), InvalidArgumentError, "in use");
}

TEST(PrefixStore, KeepsNamespacesApart) {
  auto base = std::make_shared<TcpStore>(server_options());
  PrefixStore a("group0", base);
  PrefixStore b("group1", base);
  a.set("rank", "0");
  b.set("rank", "1");
  EXPECT_EQ(a.get_string("rank"), "0");
  EXPECT_EQ(b.get_string("rank"), "1");
  EXPECT_EQ(base->get_string("group0/rank"), "0");
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_TRUE(a.check({"rank", "n"}));
  EXPECT_FALSE(b.check({"n"}));
  EXPECT_TRUE(b.delete_key("rank"));
  EXPECT_FALSE(base->check({"group1/rank"}));
  EXPECT_THROW_MSG(b.wait({"absent"}, 10ms), TimeoutError, "group1/absent");
}

}  // namespace
}  // namespace datapar
