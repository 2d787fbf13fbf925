// Shutting down TCP connections of this process known only by their addresses: how a gloo
// group aborts (Note [Aborting a gloo group] in process_group.cc), since gloo does not hand
// out its sockets.
#pragma once

#include <sys/socket.h>

#include <vector>

namespace datapar::detail {

// Shuts down, in both directions, every TCP socket of this process whose local address is
// one of `locals` or whose remote address is one of `remotes` (address and port, IPv4 or
// IPv6). The socket stays open (its owner closes it), but a thread blocked on it and its
// peer both see the connection end. Returns how many it shut down. Reads /proc/self/net/tcp,
// tcp6 and fd (no descriptor but the matching ones is touched).
int shut_down_sockets(const std::vector<sockaddr_storage>& locals, const std::vector<sockaddr_storage>& remotes);

}  // namespace datapar::detail
