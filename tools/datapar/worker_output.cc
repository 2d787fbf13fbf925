// See worker_output.h.
#include "worker_output.h"

#include <errno.h>
#include <unistd.h>

namespace datapar::tools {

namespace {

// write() all of it; a reader that went away (EPIPE) or a full disk loses output but must
// not stop the launcher from supervising its workers, so errors are dropped.
void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void WorkerOutput::write_line(const char* data, size_t n) {
  std::string line;
  line.reserve(prefix_.size() + n + 1);
  line.append(prefix_).append(data, n);
  if (line.back() != '\n') line.push_back('\n');
  write_all(out_fd_, line.data(), line.size());
}

void WorkerOutput::pass_live_line() {
  static constexpr char kEraseToEnd[] = "\033[K";
  const size_t erase = pending_.rfind(kEraseToEnd);
  if (erase == std::string::npos || pending_.find('\r') > erase) return;
  const size_t end = erase + sizeof kEraseToEnd - 1;
  write_all(out_fd_, pending_.data(), end);
  pending_.erase(0, end);
}

void WorkerOutput::add(const char* data, size_t n) {
  pending_.append(data, n);
  size_t start = 0;
  for (;;) {
    const size_t newline = pending_.find('\n', start);
    if (newline == std::string::npos) break;
    write_line(pending_.data() + start, newline - start + 1);
    start = newline + 1;
  }
  pending_.erase(0, start);
  if (live_) pass_live_line();
  while (pending_.size() >= kMaxLineBytes) {
    write_line(pending_.data(), kMaxLineBytes);
    pending_.erase(0, kMaxLineBytes);
  }
}

void WorkerOutput::flush() {
  if (pending_.empty()) return;
  write_line(pending_.data(), pending_.size());
  pending_.clear();
}

}  // namespace datapar::tools
