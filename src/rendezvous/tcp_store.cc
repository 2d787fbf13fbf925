// TcpStore, the client side. See tcp_store.h, and tcp_wire.h for the format.
#include "datapar/rendezvous/tcp_store.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "datapar/error.h"
#include "rendezvous/socket.h"
#include "rendezvous/tcp_store_server.h"
#include "rendezvous/tcp_wire.h"

namespace datapar {

using detail::str_cat;
using detail::wire::Op;
using detail::wire::Reader;
using detail::wire::Status;
using detail::wire::Writer;

// A reply frame: its status and the rest of its body.
struct TcpStore::Reply {
  Status status;
  Bytes body;
  Reader fields() const { return Reader(body.data() + 1, body.size() - 1); }
};

namespace {

// Time the server gets beyond a wait's own timeout to send its kTimeout reply.
constexpr auto kReplyGrace = std::chrono::seconds(10);

std::string resolve_token(const std::string& given) {
  if (!given.empty()) return given;
  const char* env = std::getenv("DATAPAR_STORE_TOKEN");
  return env ? env : "";
}

std::string join(const std::vector<std::string>& keys) {
  std::ostringstream out;
  for (size_t i = 0; i < keys.size(); ++i) out << (i ? ", " : "") << '"' << keys[i] << '"';
  return out.str();
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options)
    : Store(options.timeout), host_(options.host), port_(options.port) {
  const std::string token = resolve_token(options.token);
  if (options.is_server) {
    server_ = std::make_unique<detail::TcpStoreServer>(host_, port_, token);
    port_ = server_->port();
  }
  const std::string connect_host = options.is_server && (host_ == "0.0.0.0" || host_ == "::") ? "127.0.0.1" : host_;
  fd_ = detail::connect_tcp(connect_host, port_, timeout(), "TcpStore");
  Writer hello;
  for (char m : detail::wire::kMagic) hello.u8(static_cast<uint8_t>(m));
  hello.u8(detail::wire::kVersion).str(token);
  const Reply reply = call(hello.frame(), timeout());
  if (reply.status != Status::kOk) {
    Reader r = reply.fields();
    const std::string reason = r.str();
    ::close(fd_);
    fd_ = -1;
    throw InvalidArgumentError(str_cat("TcpStore: ", where(), " refused this process: ", reason,
                                       ". Give every process of the job the same token (DATAPAR_STORE_TOKEN;",
                                       " datapar launch sets it)."));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();  // after closing our own connection
}

std::string TcpStore::where() const { return host_ + ":" + std::to_string(port_); }

TcpStore::Reply TcpStore::call(const Bytes& request, std::chrono::milliseconds reply_timeout) {
  if (fd_ < 0) throw CommError(str_cat("TcpStore: the connection to ", where(), " is closed (it broke earlier)."));
  const auto deadline = std::chrono::steady_clock::now() + reply_timeout;
  auto broken = [&](const char* what) {
    ::close(fd_);
    fd_ = -1;
    return CommError(str_cat("TcpStore: lost the connection to the store at ", where(), " (", what,
                             "). The server (rank 0) has probably exited; restart the job."));
  };
  if (!detail::send_all(fd_, request.data(), request.size())) throw broken("send failed");
  uint8_t header[4];
  int rc = detail::recv_exact(fd_, header, 4, deadline);
  Bytes body;
  if (rc == 1) {
    body.resize(detail::wire::frame_length(header));
    if (body.empty() || body.size() > detail::wire::kMaxFrameBytes) throw broken("malformed reply");
    rc = detail::recv_exact(fd_, body.data(), body.size(), deadline);
  }
  if (rc == 0) throw broken("the server closed it");
  if (rc == -1) throw broken("receive failed");
  if (rc == -2) {
    ::close(fd_);  // a late reply would leave the connection out of step
    fd_ = -1;
    throw TimeoutError(str_cat("TcpStore: no reply from ", where(), " within ",
                               std::chrono::duration<double>(reply_timeout).count(), " s. Is the server overloaded or stopped?"));
  }
  return Reply{static_cast<Status>(body[0]), std::move(body)};
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  call(Writer().u8(static_cast<uint8_t>(Op::kSet)).str(key).bytes(value).frame(), timeout());
}

Bytes TcpStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard<std::mutex> lock(mutex_);
  const Reply reply = call(Writer().u8(static_cast<uint8_t>(Op::kGet)).str(key).frame(), timeout());
  if (reply.status == Status::kNotFound) {
    throw TimeoutError(str_cat("TcpStore: key \"", key, "\" at ", where(), " was deleted while being read."));
  }
  return reply.fields().bytes();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Reply reply = call(Writer().u8(static_cast<uint8_t>(Op::kAdd)).str(key).i64(delta).frame(), timeout());
  if (reply.status != Status::kOk) {
    throw InvalidArgumentError(str_cat("TcpStore: add to ", key, " failed: ", reply.fields().str(), "."));
  }
  return reply.fields().i64();
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kCompareSet)).str(key).bytes(expected).bytes(desired).frame(),
              timeout())
      .fields()
      .bytes();
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait_timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Reply reply = call(
      Writer().u8(static_cast<uint8_t>(Op::kWait)).strs(keys).i64(wait_timeout.count()).frame(),
      wait_timeout + kReplyGrace);
  if (reply.status == Status::kTimeout) {
    Reader r = reply.fields();
    throw TimeoutError(str_cat("TcpStore: waited ", std::chrono::duration<double>(wait_timeout).count(),
                               " s at ", where(), " for ", join(keys), "; still missing: ", join(r.strs()),
                               ". Did every process start and reach this point? Raise the timeout if they are slow."));
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kCheck)).strs(keys).frame(), timeout()).fields().u8() != 0;
}

bool TcpStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kDelete)).str(key).frame(), timeout()).fields().u8() != 0;
}

int64_t TcpStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kNumKeys)).frame(), timeout()).fields().i64();
}

}  // namespace datapar
