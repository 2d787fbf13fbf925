// See store_token.h.
#include "rendezvous/store_token.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "datapar/error.h"
#include "new_file.h"
#include "random_bytes.h"
#include "rendezvous/tcp_wire.h"

namespace datapar::detail {
namespace {

std::string token_dir() { return "/tmp/datapar-" + std::to_string(::geteuid()); }

// Why `dir` cannot hold a secret (empty: it can): it must be a directory of this user's
// that nobody else may enter, not a link someone planted.
std::string not_private(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  if (st.st_uid != ::geteuid()) return str_cat("owned by uid ", st.st_uid, ", not ", ::geteuid());
  if ((st.st_mode & 077) != 0) return str_cat("mode 0", std::oct, (st.st_mode & 0777), ", not 0700");
  return "";
}

}  // namespace

std::string random_token() {
  std::string token = random_hex(16);
  if (token.empty()) throw Error(str_cat("TcpStore: cannot read random bytes for a store token: ", std::strerror(errno)));
  return token;
}

std::string local_token_path(uint16_t port) { return token_dir() + "/store-" + std::to_string(port) + ".token"; }

void publish_local_token(uint16_t port, const std::string& token) {
  const std::string dir = token_dir();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw InvalidArgumentError(str_cat("TcpStore: cannot create ", dir, " for this job's generated store token (",
                                       std::strerror(errno), "). Give every process the same DATAPAR_STORE_TOKEN."));
  }
  const std::string why = not_private(dir);
  DATAPAR_CHECK(why.empty(), "TcpStore: ", dir, " is not private to this user (", why,
                "), so the store token generated for this job cannot be shared there. Remove it, or give every ",
                "process the same DATAPAR_STORE_TOKEN (e.g. export DATAPAR_STORE_TOKEN=$(openssl rand -hex 16)).");
  const std::string path = local_token_path(port);
  const TemporaryFile temp = create_temporary_beside(path, 0600);  // Note [Creating a file]
  const int fd = temp.fd;
  bool ok = fd >= 0 && ::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  ok = ok && ::rename(temp.path.c_str(), path.c_str()) == 0;  // readers never see half a token
  if (!ok) {
    const std::string error = fd < 0 ? temp.error : std::strerror(errno);
    if (fd >= 0) ::unlink(temp.path.c_str());
    throw InvalidArgumentError(str_cat("TcpStore: cannot write the generated store token to ", path, " (", error,
                                       "). Give every process the same DATAPAR_STORE_TOKEN."));
  }
}

std::optional<std::string> read_local_token(uint16_t port) {
  if (!not_private(token_dir()).empty()) return std::nullopt;
  const int fd = ::open(local_token_path(port).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  char buffer[wire::kMaxTokenBytes + 1];
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0) {
    n = ::read(fd, buffer, sizeof(buffer));
  }
  ::close(fd);
  if (n <= 0 || n > static_cast<ssize_t>(wire::kMaxTokenBytes)) return std::nullopt;
  return std::string(buffer, static_cast<size_t>(n));
}

void remove_local_token(uint16_t port, const std::string& token) {
  const auto published = read_local_token(port);
  if (published && *published == token) ::unlink(local_token_path(port).c_str());
}

bool is_local_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &list) != 0) return false;
  bool local = false;
  for (addrinfo* a = list; a != nullptr && !local; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    local = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // only an address of ours binds
    ::close(fd);
  }
  ::freeaddrinfo(list);
  return local;
}

}  // namespace datapar::detail
