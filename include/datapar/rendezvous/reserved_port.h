// ReservedPort: a TCP port kept free for a store that another process will serve.
//
// A launcher chooses rank 0's port (MASTER_PORT) before rank 0 exists. A port found free
// and let go stays free only by luck: until rank 0 binds it, any process may take it (a bind
// to port 0, the local port of an outgoing connection), and rank 0 then fails with "address
// in use". A ReservedPort is bound with SO_REUSEADDR and never listens. While it lives the
// kernel hands the port to no one else, yet a server that binds it with SO_REUSEADDR and
// listens still can: datapar's TcpStore, and PyTorch's TCPStore for Python workers. Until
// one listens, connecting is refused (clients retry). Programs started from this process do
// not inherit the socket (close-on-exec): the reservation ends with this object.
//
//   const ReservedPort reserved("127.0.0.1");  // held until the job ends, restarts included
//   env["MASTER_PORT"] = std::to_string(reserved.port());
#pragma once

#include <cstdint>
#include <string>

namespace datapar {

class ReservedPort {
 public:
  // Takes a free port on `host`, an address of this machine. Throws InvalidArgumentError
  // naming the address when it cannot.
  explicit ReservedPort(const std::string& host = "127.0.0.1");
  ~ReservedPort();
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

}  // namespace datapar
