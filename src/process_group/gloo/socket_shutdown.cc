// See socket_shutdown.h.
#include "process_group/gloo/socket_shutdown.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace datapar::detail {
namespace {

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

bool any_of(const std::vector<sockaddr_storage>& list, const sockaddr_storage& address) {
  for (const sockaddr_storage& a : list) {
    if (same_endpoint(a, address)) return true;
  }
  return false;
}

}  // namespace

int shut_down_sockets(const std::vector<sockaddr_storage>& locals, const std::vector<sockaddr_storage>& remotes) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int shut = 0;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, remote{};
    socklen_t local_length = sizeof local, remote_length = sizeof remote;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_length) != 0) continue;
    const bool connected =
        ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&remote), &remote_length) == 0;
    if (!connected) continue;  // a listening socket, or one not connected yet
    if (any_of(locals, local) || any_of(remotes, remote)) {
      if (::shutdown(static_cast<int>(fd), SHUT_RDWR) == 0) ++shut;
    }
  }
  ::closedir(dir);
  return shut;
}

}  // namespace datapar::detail
