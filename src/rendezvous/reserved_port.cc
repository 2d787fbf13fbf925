// See reserved_port.h.
#include "datapar/rendezvous/reserved_port.h"

#include <unistd.h>

#include "rendezvous/socket.h"

namespace datapar {

ReservedPort::ReservedPort(const std::string& host) { fd_ = detail::reserve_tcp_port(host, &port_); }

ReservedPort::~ReservedPort() { ::close(fd_); }

}  // namespace datapar
