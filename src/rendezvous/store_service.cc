// StoreService. See store_service.h for the design, tcp_wire.h for the format.
#include "rendezvous/store_service.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "datapar/error.h"
#include "rendezvous/store_handshake.h"
#include "rendezvous/tcp_wire.h"

namespace datapar::detail {
namespace {

using wire::Op;
using wire::Reader;
using wire::Status;
using wire::Writer;

Writer status(Status s) { return std::move(Writer().u8(static_cast<uint8_t>(s))); }

// The integer a value holds (decimal text), if it holds one.
std::optional<int64_t> as_integer(const Bytes& value) {
  const std::string text(value.begin(), value.end());
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

}  // namespace

StoreService::StoreService(std::string token, const std::string& run_id, StoreLimits limits,
                           std::function<Bytes()> make_nonce)
    : token_(std::move(token)),
      run_digest_(handshake::run_digest(run_id)),
      limits_(limits),
      make_nonce_(make_nonce ? std::move(make_nonce) : std::function<Bytes()>(handshake::fresh_nonce)) {}

StoreService::Id StoreService::connect(Clock::time_point now) {
  now_ = now;
  while (strangers_ >= limits_.max_strangers && !stranger_order_.empty()) {
    const Id oldest = stranger_order_.front();
    stranger_order_.pop_front();
    auto it = connections_.find(oldest);
    if (it != connections_.end() && !it->second.greeted && it->second.fate != Fate::kClose) close(oldest, it->second);
  }
  const Id id = next_id_++;
  Connection& c = connections_[id];
  c.hello_deadline = now + limits_.hello_timeout;
  stranger_order_.push_back(id);
  ++strangers_;
  return id;
}

void StoreService::close(Id id, Connection& c) {
  if (!c.greeted && c.fate != Fate::kClose) --strangers_;
  if (c.waiting) waits_.erase({c.wait_deadline, id}), c.waiting.reset();
  c.fate = Fate::kClose;
  c.in = Bytes();
  c.in_used = 0;
  c.out = Bytes();
  c.out_sent = 0;
}

void StoreService::disconnect(Id id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  close(id, it->second);
  connections_.erase(it);
}

bool StoreService::blocked(const Connection& c) const {
  return c.fate != Fate::kOpen || c.waiting || c.out.size() - c.out_sent > limits_.max_output_bytes;
}

size_t StoreService::want(Id id) const {
  auto it = connections_.find(id);
  if (it == connections_.end() || blocked(it->second)) return 0;
  const Connection& c = it->second;
  const size_t held = c.in.size() - c.in_used;
  if (!c.greeted) {  // exactly what completes the hello, never more (Note [Strangers])
    if (held < 4) return 4 - held;
    return 4 + static_cast<size_t>(wire::frame_length(c.in.data() + c.in_used)) - held;
  }
  // Unblocked, so `in` holds no complete frame: at most the rest of one, and what
  // follows it in the same read.
  return SIZE_MAX;
}

void StoreService::receive(Id id, const uint8_t* data, size_t size, Clock::time_point now) {
  now_ = now;
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second.fate != Fate::kOpen) return;
  Connection& c = it->second;
  c.in.insert(c.in.end(), data, data + size);
  process(id, c);
  run_ready();
}

std::pair<const uint8_t*, size_t> StoreService::output(Id id) const {
  auto it = connections_.find(id);
  if (it == connections_.end()) return {nullptr, 0};
  const Connection& c = it->second;
  return {c.out.data() + c.out_sent, c.out.size() - c.out_sent};
}

void StoreService::sent(Id id, size_t n, Clock::time_point now) {
  now_ = now;
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  const bool was_blocked = blocked(c);
  c.out_sent = std::min(c.out.size(), c.out_sent + n);
  if (c.out_sent == c.out.size()) {
    // Give a large reply's memory back rather than keep it for the connection's life.
    if (c.out.capacity() > limits_.max_output_bytes) {
      c.out = Bytes();
    } else {
      c.out.clear();
    }
    c.out_sent = 0;
  }
  if (was_blocked && !blocked(c)) {
    process(id, c);
    run_ready();
  }
}

bool StoreService::done(Id id) const {
  auto it = connections_.find(id);
  if (it == connections_.end()) return true;
  const Connection& c = it->second;
  return c.fate == Fate::kClose || (c.fate == Fate::kCloseAfterOutput && c.out_sent == c.out.size());
}

std::optional<StoreService::Clock::time_point> StoreService::expire(Clock::time_point now) {
  now_ = now;
  // Strangers arrive in deadline order, so the expired ones are at the front.
  while (!stranger_order_.empty()) {
    auto it = connections_.find(stranger_order_.front());
    if (it == connections_.end() || it->second.greeted || it->second.fate == Fate::kClose) {
      stranger_order_.pop_front();
      continue;
    }
    if (it->second.hello_deadline > now) break;
    close(it->first, it->second);
    stranger_order_.pop_front();
  }
  while (!waits_.empty() && waits_.begin()->first <= now) {
    const Id id = waits_.begin()->second;
    waits_.erase(waits_.begin());
    Connection& c = connections_.at(id);
    std::vector<std::string> missing;
    for (const std::string& k : *c.waiting) {
      if (!table_.count(k)) missing.push_back(k);
    }
    c.waiting.reset();
    reply(c, status(Status::kTimeout).strs(missing).frame());
    ready_.push_back(id);
  }
  run_ready();
  std::optional<Clock::time_point> next;
  if (!stranger_order_.empty()) next = connections_.at(stranger_order_.front()).hello_deadline;
  if (!waits_.empty() && (!next || waits_.begin()->first < *next)) next = waits_.begin()->first;
  return next;
}

void StoreService::reply(Connection& c, const Bytes& frame) { c.out.insert(c.out.end(), frame.begin(), frame.end()); }

void StoreService::process(Id id, Connection& c) {
  while (!blocked(c)) {
    const size_t held = c.in.size() - c.in_used;
    if (held < 4) break;
    const uint32_t n = wire::frame_length(c.in.data() + c.in_used);
    // Refused on the length alone, before its body is read (Note [Strangers]).
    if (n == 0 || n > (c.greeted ? wire::kMaxFrameBytes : wire::kMaxHelloBytes)) {
      close(id, c);
      return;
    }
    if (held - 4 < n) break;
    const size_t at = c.in_used + 4;
    c.in_used += 4 + n;
    if (!serve(id, c, c.in.data() + at, n)) {
      close(id, c);
      return;
    }
  }
  // Keep only what is not served yet.
  if (c.in_used > 0 && c.fate != Fate::kClose) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_used));
    c.in_used = 0;
    if (c.in.empty() && c.in.capacity() > (1u << 20)) c.in = Bytes();
  }
}

void StoreService::run_ready() {
  while (!ready_.empty()) {
    const Id id = ready_.back();
    ready_.pop_back();
    auto it = connections_.find(id);
    if (it != connections_.end()) process(id, it->second);
  }
}

bool StoreService::has_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return table_.count(k) > 0; });
}

void StoreService::wake_waiters() {
  for (auto it = waits_.begin(); it != waits_.end();) {
    Connection& c = connections_.at(it->second);
    if (has_all(*c.waiting)) {
      c.waiting.reset();
      reply(c, status(Status::kOk).frame());
      ready_.push_back(it->second);
      it = waits_.erase(it);
    } else {
      ++it;
    }
  }
}

void StoreService::refuse(Connection& c, const std::string& why) {
  reply(c, status(Status::kRefused).str(why).frame());
  c.fate = Fate::kCloseAfterOutput;
}

// Note [Handshake], steps 1 and 2. A hello that does not decode closes the connection; one
// that does is answered, a refused one then closed. Either way the connection stays a
// stranger until its proof (serve_proof).
bool StoreService::serve_hello(Connection& c, const uint8_t* body, uint32_t size) {
  Reader r(body, size);
  char magic[4];
  for (char& m : magic) m = static_cast<char>(r.u8());
  const uint8_t version = r.u8();
  if (!r.ok() || std::memcmp(magic, wire::kMagic, 4) != 0) return false;
  if (version != wire::kVersion) {
    // Answered before anything else is read: version 1 sent its token in clear.
    refuse(c, str_cat("this store speaks protocol version ", int{wire::kVersion}, " and this process version ",
                      int{version}, ": run the same datapar in every process of the job"));
    return true;
  }
  const Bytes client_nonce = r.bytes();
  const Bytes run = r.bytes();
  if (!r.done() || client_nonce.size() != handshake::kNonceBytes || run.size() != handshake::kDigestBytes) return false;
  if (!handshake::same_bytes(run, run_digest_)) {
    refuse(c, "this store belongs to another job (its run id differs from this process's: DATAPAR_RUN_ID, or "
              "datapar launch --run-id). Two jobs share one store address: give each its own MASTER_PORT "
              "(datapar launch --master-port), or let datapar launch choose a free one");
    return true;
  }
  const Bytes server_nonce = make_nonce_();
  reply(c, status(Status::kOk)
               .bytes(server_nonce)
               .bytes(handshake::proof(token_, handshake::Side::kServer, client_nonce, server_nonce, run_digest_))
               .frame());
  c.expected_proof = handshake::proof(token_, handshake::Side::kClient, client_nonce, server_nonce, run_digest_);
  return true;
}

// Note [Handshake], steps 3 and 4.
bool StoreService::serve_proof(Connection& c, const uint8_t* body, uint32_t size) {
  Reader r(body, size);
  const Bytes proof = r.bytes();
  if (!r.done()) return false;
  if (!handshake::same_bytes(proof, c.expected_proof)) {
    refuse(c, "the store token does not match this job's");
    return true;
  }
  c.expected_proof.clear();
  --strangers_;
  c.greeted = true;
  reply(c, status(Status::kOk).frame());
  return true;
}

bool StoreService::serve(Id id, Connection& c, const uint8_t* body, uint32_t size) {
  if (!c.greeted) return c.expected_proof.empty() ? serve_hello(c, body, size) : serve_proof(c, body, size);
  Reader r(body, size);
  const auto op = static_cast<Op>(r.u8());
  const auto ok = [] { return status(Status::kOk); };
  switch (op) {
    case Op::kSet: {
      std::string key = r.str();
      Bytes value = r.bytes();
      if (!r.done()) return false;
      table_[std::move(key)] = std::move(value);
      reply(c, ok().frame());
      wake_waiters();
      return true;
    }
    case Op::kGet: {
      const std::string key = r.str();
      if (!r.done()) return false;
      auto it = table_.find(key);
      reply(c, it == table_.end() ? status(Status::kNotFound).frame() : ok().bytes(it->second).frame());
      return true;
    }
    case Op::kAdd: {
      const std::string key = r.str();
      const int64_t delta = r.i64();
      if (!r.done()) return false;
      int64_t value = 0;
      auto it = table_.find(key);
      if (it != table_.end()) {
        const auto held = as_integer(it->second);
        if (!held) {
          reply(c, status(Status::kError).str("key \"" + key + "\" does not hold an integer").frame());
          return true;
        }
        value = *held;
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(value, delta, &sum)) {
        reply(c, status(Status::kError)
                     .str("adding " + std::to_string(delta) + " to key \"" + key + "\" (" + std::to_string(value) +
                          ") would overflow a signed 64-bit integer")
                     .frame());
        return true;
      }
      const std::string text = std::to_string(sum);
      table_[key] = Bytes(text.begin(), text.end());
      reply(c, ok().i64(sum).frame());
      wake_waiters();
      return true;
    }
    case Op::kCompareSet: {
      const std::string key = r.str();
      const Bytes expected = r.bytes();
      Bytes desired = r.bytes();
      if (!r.done()) return false;
      auto it = table_.find(key);
      if (it == table_.end()) {
        if (expected.empty()) {
          reply(c, ok().bytes(desired).frame());
          table_[key] = std::move(desired);
          wake_waiters();
        } else {
          reply(c, ok().bytes(expected).frame());
        }
      } else {
        if (it->second == expected) it->second = std::move(desired);
        reply(c, ok().bytes(it->second).frame());
      }
      return true;
    }
    case Op::kWait: {
      std::vector<std::string> keys = r.strs();
      const int64_t ms = r.i64();
      if (!r.done()) return false;
      if (has_all(keys)) {
        reply(c, ok().frame());
      } else {
        // Up to about 35 years: a time point the clock can hold, however large the request.
        c.wait_deadline = now_ + std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, int64_t{1} << 40));
        c.waiting = std::move(keys);
        waits_.insert({c.wait_deadline, id});
      }
      return true;
    }
    case Op::kCheck: {
      const std::vector<std::string> keys = r.strs();
      if (!r.done()) return false;
      reply(c, ok().u8(has_all(keys) ? 1 : 0).frame());
      return true;
    }
    case Op::kDelete: {
      const std::string key = r.str();
      if (!r.done()) return false;
      reply(c, ok().u8(table_.erase(key) ? 1 : 0).frame());
      return true;
    }
    case Op::kNumKeys: {
      if (!r.done()) return false;
      reply(c, ok().i64(static_cast<int64_t>(table_.size())).frame());
      return true;
    }
    case Op::kHello:
    case Op::kProof:
      break;  // the handshake's messages, never a greeted client's request
  }
  return false;  // unknown op
}

}  // namespace datapar::detail
