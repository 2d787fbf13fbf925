// Small POSIX socket helpers shared by the TcpStore server and client.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace datapar::detail {

// A listening TCP socket on host:port (port 0: any free port), non-blocking. `before_listen`
// runs once the port is bound and before anyone can connect (it may throw).
// Throws InvalidArgumentError saying why it could not listen (port in use, bad address).
int listen_tcp(const std::string& host, uint16_t port, uint16_t* bound_port,
               const std::function<void(uint16_t port)>& before_listen = {});

// A socket bound to a free port of host with SO_REUSEADDR that never listens (ReservedPort);
// sets *port. Throws InvalidArgumentError when no address of host can be bound.
int reserve_tcp_port(const std::string& host, uint16_t* port);

// Connects to host:port, retrying with backoff until `timeout` passes. Returns a blocking
// socket with TCP_NODELAY. Throws TimeoutError naming the address and the last error.
int connect_tcp(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                const char* who);

void set_nonblocking(int fd, bool on);

// Sends all of data; false on a broken connection (never raises SIGPIPE).
bool send_all(int fd, const uint8_t* data, size_t size);

// Reads at most size bytes (at least 1), waiting at most until deadline. Returns the count,
// or 0 when the peer closed the connection, -1 on error, -2 on timeout.
ssize_t recv_some(int fd, uint8_t* data, size_t size, std::chrono::steady_clock::time_point deadline);

}  // namespace datapar::detail
