// See socket_shutdown.h.
//
// The sockets are found without touching any descriptor but theirs: /proc/self/net/tcp and
// tcp6 map each TCP socket's inode to its two addresses, and /proc/self/fd's links name the
// inode behind each descriptor. (Calling fstat or getsockname on every descriptor would
// touch ones other threads are opening or closing at that moment.)
#include "process_group/gloo/socket_shutdown.h"

#include <dirent.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

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

// An address as /proc/net/tcp{,6} prints it: the address's 32-bit words in hex as the
// machine stores them, a colon, the port in hex.
bool parse_address(const std::string& text, int family, sockaddr_storage* out) {
  const size_t colon = text.find(':');
  const size_t words = family == AF_INET ? 1 : 4;
  if (colon != 8 * words) return false;
  *out = sockaddr_storage{};
  uint32_t address[4] = {};
  for (size_t w = 0; w < words; ++w) {
    address[w] = static_cast<uint32_t>(std::strtoul(text.substr(8 * w, 8).c_str(), nullptr, 16));
  }
  const auto port = htons(static_cast<uint16_t>(std::strtoul(text.substr(colon + 1).c_str(), nullptr, 16)));
  if (family == AF_INET) {
    auto& in = reinterpret_cast<sockaddr_in&>(*out);
    in.sin_family = AF_INET;
    in.sin_port = port;
    std::memcpy(&in.sin_addr, address, 4);
  } else {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(*out);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = port;
    std::memcpy(&in6.sin6_addr, address, 16);
  }
  return true;
}

// The inodes of the TCP sockets listed in `table` whose local address is in `locals` or
// whose remote address is in `remotes`.
void matching_inodes(const char* table, int family, const std::vector<sockaddr_storage>& locals,
                     const std::vector<sockaddr_storage>& remotes, std::set<std::string>* inodes) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local_text, remote_text, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> slot >> local_text >> remote_text >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode)) {
      continue;
    }
    sockaddr_storage local{}, remote{};
    if (!parse_address(local_text, family, &local) || !parse_address(remote_text, family, &remote)) continue;
    if (inode != "0" && (any_of(locals, local) || any_of(remotes, remote))) inodes->insert(inode);
  }
}

}  // namespace

int shut_down_sockets(const std::vector<sockaddr_storage>& locals, const std::vector<sockaddr_storage>& remotes) {
  std::set<std::string> inodes;
  try {
    matching_inodes("/proc/self/net/tcp", AF_INET, locals, remotes, &inodes);
    matching_inodes("/proc/self/net/tcp6", AF_INET6, locals, remotes, &inodes);
  } catch (const std::exception&) {
    // A table that cannot be read (libstdc++'s filebuf throws on read errors whatever the
    // mask): what was read counts.
  }
  if (inodes.empty()) return 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int shut = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    char link[64] = {};
    const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
    if (n <= 0) continue;
    const std::string target(link, static_cast<size_t>(n));  // "socket:[12345]"
    if (target.rfind("socket:[", 0) != 0 || target.back() != ']') continue;
    if (inodes.count(target.substr(8, target.size() - 9)) == 0) continue;
    if (::shutdown(std::atoi(entry->d_name), SHUT_RDWR) == 0) ++shut;
  }
  ::closedir(dir);
  return shut;
}

}  // namespace datapar::detail
