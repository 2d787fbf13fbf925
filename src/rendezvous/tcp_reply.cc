// See tcp_reply.h.
#include "rendezvous/tcp_reply.h"

#include <algorithm>

namespace datapar::detail::wire {

std::optional<Reply> decode_reply(Op request, const uint8_t* body, size_t size) {
  Reader r(body, size);
  Reply reply;
  const uint8_t status = r.u8();
  if (!r.ok() || status > static_cast<uint8_t>(Status::kError)) return std::nullopt;
  reply.status = static_cast<Status>(status);
  switch (reply.status) {
    case Status::kOk:
      switch (request) {
        case Op::kHello:
          reply.value = r.bytes();
          reply.proof = r.bytes();
          break;
        case Op::kProof:
        case Op::kSet:
        case Op::kWait:
          break;
        case Op::kGet:
        case Op::kCompareSet:
          reply.value = r.bytes();
          break;
        case Op::kAdd:
        case Op::kNumKeys:
          reply.number = r.i64();
          break;
        case Op::kCheck:
        case Op::kDelete: {
          const uint8_t flag = r.u8();
          if (flag > 1) return std::nullopt;
          reply.flag = flag == 1;
          break;
        }
        default:
          return std::nullopt;
      }
      break;
    case Status::kRefused:
      if (request != Op::kHello && request != Op::kProof) return std::nullopt;
      reply.message = r.str();
      break;
    case Status::kNotFound:
      if (request != Op::kGet) return std::nullopt;
      break;
    case Status::kTimeout:
      if (request != Op::kWait) return std::nullopt;
      reply.keys = r.strs();
      break;
    case Status::kError:
      if (request == Op::kHello || request == Op::kProof) return std::nullopt;
      reply.message = r.str();
      break;
  }
  if (!r.done()) return std::nullopt;
  return reply;
}

size_t FrameCollector::missing() const {
  if (bad_) return 0;
  if (header_got_ < 4) return 4 - header_got_;
  return length_ - body_.size();
}

bool FrameCollector::add(const uint8_t* data, size_t size) {
  size = std::min(size, missing());
  while (size > 0 && header_got_ < 4) {
    header_[header_got_++] = *data++;
    --size;
    if (header_got_ == 4) {
      length_ = frame_length(header_);
      if (length_ == 0 || length_ > max_body_) {
        bad_ = true;
        return false;
      }
    }
  }
  body_.insert(body_.end(), data, data + size);
  return !bad_;
}

}  // namespace datapar::detail::wire
