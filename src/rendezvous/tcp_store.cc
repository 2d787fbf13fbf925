// TcpStore, the client side. See tcp_store.h, tcp_wire.h for the format and tcp_reply.h
// for how replies are read.
#include "datapar/rendezvous/tcp_store.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <thread>

#include "datapar/error.h"
#include "rendezvous/socket.h"
#include "rendezvous/store_handshake.h"
#include "rendezvous/store_token.h"
#include "rendezvous/tcp_reply.h"
#include "rendezvous/tcp_store_server.h"
#include "rendezvous/tcp_wire.h"

namespace datapar {

using detail::str_cat;
using detail::wire::Op;
using detail::wire::Reply;
using detail::wire::Status;
using detail::wire::Writer;

namespace {

using Clock = std::chrono::steady_clock;

// Time the server gets beyond a wait's own timeout to send its kTimeout reply.
constexpr auto kReplyGrace = std::chrono::seconds(10);

const char kTokenHint[] =
    "Give every process of the job the same token: export DATAPAR_STORE_TOKEN=$(openssl rand -hex 16) on every "
    "node, or start them with datapar launch --token-file FILE.";

std::string join(const std::vector<std::string>& keys) {
  std::ostringstream out;
  for (size_t i = 0; i < keys.size(); ++i) out << (i ? ", " : "") << '"' << keys[i] << '"';
  return out.str();
}

}  // namespace

std::string make_store_token() { return detail::random_token(); }

TcpStore::TcpStore(TcpStoreOptions options)
    : Store(options.timeout), host_(options.host), port_(options.port), token_(options.token),
      run_id_(options.run_id) {
  const auto deadline = Clock::now() + timeout();
  DATAPAR_CHECK(token_.size() <= detail::wire::kMaxTokenBytes, "TcpStore: the store token has ", token_.size(),
                " bytes; it may have at most ", detail::wire::kMaxTokenBytes, " bytes.");
  const bool generated = token_.empty();  // Note [Token] in store_token.h
  connect_host_ = options.is_server && (host_ == "0.0.0.0" || host_ == "::") ? "127.0.0.1" : host_;
  if (options.is_server) {
    if (generated) token_ = detail::random_token();
    server_ = std::make_unique<detail::TcpStoreServer>(host_, port_, token_, run_id_, /*publish=*/generated);
    port_ = server_->port();
  } else if (generated) {
    DATAPAR_CHECK(detail::is_local_address(connect_host_), "TcpStore: this process has no store token, and the ",
                  "store at ", where(), " is on another machine, where a generated token cannot be read. ", kTokenHint);
  }
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    fd_ = detail::connect_tcp(connect_host_, port_, std::max(left, std::chrono::milliseconds(1)), "TcpStore");
    if (generated && !options.is_server) {
      // The server published its token before it listened, so it is there now.
      const auto published = detail::read_local_token(port_);
      if (!published) {
        ::close(fd_);
        fd_ = -1;
        throw InvalidArgumentError(str_cat("TcpStore: this process has no store token, and the store at ", where(),
                                           " published none on this machine (", detail::local_token_path(port_),
                                           "): it was given one. ", kTokenHint));
      }
      token_ = *published;
    }
    const Exchange result = handshake(deadline);
    if (result == Exchange::kOk) return;
    // Closed before it answered: a server busy with a flood of strangers drops the oldest
    // ones, and this may have been one. Try again while there is time.
    if (result == Exchange::kClosed && Clock::now() + backoff < deadline) {
      ::close(fd_);
      fd_ = -1;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      continue;
    }
    fail(result, "the handshake", timeout());
  }
}

TcpStore::Exchange TcpStore::handshake(Clock::time_point deadline) {
  namespace hs = detail::handshake;
  auto refused = [this](const std::string& why, const char* hint) {
    ::close(fd_);
    fd_ = -1;
    return InvalidArgumentError(str_cat("TcpStore: ", where(), " refused this process: ", why, ".",
                                        *hint ? " " : "", hint));
  };
  const Bytes client_nonce = hs::fresh_nonce();
  const Bytes run = hs::run_digest(run_id_);
  Reply hello;
  Exchange result = exchange(detail::wire::hello_frame(client_nonce, run), Op::kHello, deadline, &hello);
  if (result != Exchange::kOk) return result;
  if (hello.status != Status::kOk) throw refused(hello.message, "");
  const Bytes& server_nonce = hello.value;
  if (server_nonce.size() != hs::kNonceBytes ||
      !hs::same_bytes(hello.proof, hs::proof(token_, hs::Side::kServer, client_nonce, server_nonce, run))) {
    ::close(fd_);
    fd_ = -1;
    throw InvalidArgumentError(str_cat(
        "TcpStore: the server at ", where(), " does not share this process's store token (its proof of the token ",
        "does not match): this process has the wrong token, or another job's store or another program holds the ",
        "port. Nothing secret was sent to it. Check MASTER_ADDR and MASTER_PORT. ", kTokenHint));
  }
  Reply verdict;
  result = exchange(detail::wire::proof_frame(hs::proof(token_, hs::Side::kClient, client_nonce, server_nonce, run)),
                    Op::kProof, deadline, &verdict);
  if (result != Exchange::kOk) return result;
  if (verdict.status != Status::kOk) throw refused(verdict.message, kTokenHint);
  return Exchange::kOk;
}

std::shared_ptr<Store> TcpStore::clone(std::chrono::milliseconds timeout) const {
  TcpStoreOptions options;
  options.host = connect_host_;
  options.port = port_;
  options.token = token_;
  options.run_id = run_id_;
  options.timeout = timeout;
  return std::make_shared<TcpStore>(options);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();  // after closing our own connection
}

std::string TcpStore::where() const { return host_ + ":" + std::to_string(port_); }

TcpStore::Exchange TcpStore::exchange(const Bytes& request, Op op, Clock::time_point deadline, Reply* reply) {
  if (!detail::send_all(fd_, request.data(), request.size())) return Exchange::kClosed;
  const bool handshake = op == Op::kHello || op == Op::kProof;
  detail::wire::FrameCollector frame(handshake ? detail::wire::kMaxHelloBytes : detail::wire::kMaxFrameBytes);
  uint8_t buffer[64 << 10];
  while (!frame.complete()) {
    const ssize_t n = detail::recv_some(fd_, buffer, std::min(sizeof(buffer), frame.missing()), deadline);
    if (n == 0) return Exchange::kClosed;
    if (n == -1) return errno == ECONNRESET ? Exchange::kClosed : Exchange::kBroken;
    if (n == -2) return Exchange::kTimeout;
    if (!frame.add(buffer, static_cast<size_t>(n))) return Exchange::kMalformed;
  }
  auto decoded = detail::wire::decode_reply(op, frame.body().data(), frame.body().size());
  if (!decoded) return Exchange::kMalformed;
  *reply = std::move(*decoded);
  return Exchange::kOk;
}

void TcpStore::fail(Exchange result, const char* what, std::chrono::milliseconds reply_timeout) {
  ::close(fd_);  // after any failure a late reply would put the connection out of step
  fd_ = -1;
  switch (result) {
    case Exchange::kTimeout:
      throw TimeoutError(str_cat("TcpStore: the job's store at ", where(), " did not answer ", what, " within ",
                                 std::chrono::duration<double>(reply_timeout).count(),
                                 " s: the process that serves it (rank 0, in jobs datapar starts) is stopped, hung, ",
                                 "overloaded or cut off from this one."));
    case Exchange::kMalformed:
      throw CommError(str_cat("TcpStore: ", where(), " answered ", what,
                              " with something that is not a datapar store reply. Is the address right ",
                              "(MASTER_ADDR, MASTER_PORT), and every process running the same datapar?"));
    default:
      throw CommError(str_cat("TcpStore: lost the connection to the store at ", where(), " (",
                              result == Exchange::kClosed ? "the server closed it" : "receive failed",
                              "). The server (rank 0) has probably exited; restart the job."));
  }
}

Reply TcpStore::call(const Bytes& request, Op op, std::chrono::milliseconds reply_timeout) {
  if (fd_ < 0) throw CommError(str_cat("TcpStore: the connection to ", where(), " is closed (it broke earlier)."));
  Reply reply;
  const Exchange result = exchange(request, op, Clock::now() + reply_timeout, &reply);
  if (result != Exchange::kOk) fail(result, "a request", reply_timeout);
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  call(Writer().u8(static_cast<uint8_t>(Op::kSet)).str(key).bytes(value).frame(), Op::kSet, timeout());
}

Bytes TcpStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard<std::mutex> lock(mutex_);
  Reply reply = call(Writer().u8(static_cast<uint8_t>(Op::kGet)).str(key).frame(), Op::kGet, timeout());
  if (reply.status == Status::kNotFound) {
    throw TimeoutError(str_cat("TcpStore: key \"", key, "\" at ", where(), " was deleted while being read."));
  }
  return std::move(reply.value);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Reply reply = call(Writer().u8(static_cast<uint8_t>(Op::kAdd)).str(key).i64(delta).frame(), Op::kAdd, timeout());
  if (reply.status != Status::kOk) {
    throw InvalidArgumentError(str_cat("TcpStore: add to ", key, " failed: ", reply.message, "."));
  }
  return reply.number;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kCompareSet)).str(key).bytes(expected).bytes(desired).frame(),
              Op::kCompareSet, timeout())
      .value;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait_timeout) {
  // Past 2^40 ms (35 years) is forever, and adding the grace must not overflow.
  const auto limit = std::min(wait_timeout, std::chrono::milliseconds(int64_t{1} << 40));
  std::lock_guard<std::mutex> lock(mutex_);
  const Reply reply = call(Writer().u8(static_cast<uint8_t>(Op::kWait)).strs(keys).i64(limit.count()).frame(),
                           Op::kWait, limit + kReplyGrace);
  if (reply.status == Status::kTimeout) {
    throw TimeoutError(str_cat("TcpStore: waited ", std::chrono::duration<double>(wait_timeout).count(),
                               " s at ", where(), " for ", join(keys), "; still missing: ", join(reply.keys),
                               ". Did every process start and reach this point? Raise the timeout if they are slow."));
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kCheck)).strs(keys).frame(), Op::kCheck, timeout()).flag;
}

bool TcpStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kDelete)).str(key).frame(), Op::kDelete, timeout()).flag;
}

int64_t TcpStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return call(Writer().u8(static_cast<uint8_t>(Op::kNumKeys)).frame(), Op::kNumKeys, timeout()).number;
}

}  // namespace datapar
