// Formatting of per-epoch metrics (see metrics.h). JSON goes through nlohmann::json so that
// model and device names with odd characters still give valid JSON, and so that the
// plotter and the tests can read the lines back with the same code.
#include "datapar/train/metrics.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "datapar/error.h"
#include "new_file.h"

namespace datapar::train {

std::string format_epoch_line(const EpochMetrics& m, bool ranks) {
  char head[256];
  std::snprintf(head, sizeof(head),
                "epoch %" PRId64 "/%" PRId64 "  loss %.3f  train acc %.3f  test acc %.3f  %.1f s  %.0f samples/s",
                m.epoch, m.epochs, m.train_loss, m.train_accuracy, m.test_accuracy, m.seconds, m.samples_per_second);
  std::string line = std::string(head) + "  devices " + m.devices + " (" + m.mode;
  if (ranks) line += ", " + std::to_string(m.world_size) + (m.world_size == 1 ? " rank" : " ranks");
  line += ")";
  if (m.straggler >= 0 && m.straggler < static_cast<int64_t>(m.straggler_scores.size())) {
    char straggler[96];
    std::snprintf(straggler, sizeof(straggler), "  straggler: rank %" PRId64 " (%.2fx the others' work per step)",
                  m.straggler, m.straggler_scores[static_cast<size_t>(m.straggler)]);
    line += straggler;
  }
  return line;
}

namespace {

nlohmann::json to_object(const EpochMetrics& m) {
  return nlohmann::json{{"epoch", m.epoch},
                        {"epochs", m.epochs},
                        {"train_loss", m.train_loss},
                        {"train_accuracy", m.train_accuracy},
                        {"test_accuracy", m.test_accuracy},
                        {"test_correct", m.test_correct},
                        {"test_samples", m.test_samples},
                        {"train_samples", m.train_samples},
                        {"seconds", m.seconds},
                        {"samples_per_second", m.samples_per_second},
                        {"eval_seconds", m.eval_seconds},
                        {"data_wait_seconds", m.data_wait_seconds},
                        {"data_wait_share", m.data_wait_share},
                        {"model", m.model},
                        {"mode", m.mode},
                        {"devices", m.devices},
                        {"world_size", m.world_size},
                        {"batch_size", m.batch_size},
                        {"lr", m.lr},
                        {"straggler_scores", m.straggler_scores},
                        {"straggler", m.straggler}};
}

template <typename T>
void read_field(const nlohmann::json& j, const char* key, T& out) {
  if (j.contains(key) && !j[key].is_null()) out = j[key].get<T>();
}

}  // namespace

std::string to_json(const EpochMetrics& m) { return to_object(m).dump(); }

EpochMetrics from_json(const std::string& line) {
  EpochMetrics m;
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    DATAPAR_CHECK(j.is_object(), "metrics: not a JSON object: ", line);
    read_field(j, "epoch", m.epoch);
    read_field(j, "epochs", m.epochs);
    read_field(j, "train_loss", m.train_loss);
    read_field(j, "train_accuracy", m.train_accuracy);
    read_field(j, "test_accuracy", m.test_accuracy);
    read_field(j, "test_correct", m.test_correct);
    read_field(j, "test_samples", m.test_samples);
    read_field(j, "train_samples", m.train_samples);
    read_field(j, "seconds", m.seconds);
    read_field(j, "samples_per_second", m.samples_per_second);
    read_field(j, "eval_seconds", m.eval_seconds);
    read_field(j, "data_wait_seconds", m.data_wait_seconds);
    read_field(j, "data_wait_share", m.data_wait_share);
    read_field(j, "model", m.model);
    read_field(j, "mode", m.mode);
    read_field(j, "devices", m.devices);
    read_field(j, "world_size", m.world_size);
    read_field(j, "batch_size", m.batch_size);
    read_field(j, "lr", m.lr);
    read_field(j, "straggler_scores", m.straggler_scores);
    read_field(j, "straggler", m.straggler);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(std::string("metrics: cannot read line \"") + line + "\": " + e.what());
  }
  return m;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  std::string error;
  fd_ = detail::open_for_writing(path, append, 0644, &error);  // Note [Creating a file]
  DATAPAR_CHECK(fd_ >= 0, "--metrics ", path, ": cannot open for writing (", error, "). Does its directory exist?");
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const EpochMetrics& m) {
  // One write per line, unbuffered: a killed run keeps every completed epoch.
  const std::string line = to_json(m) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    DATAPAR_CHECK(n > 0, "--metrics ", path_, ": cannot write (", n < 0 ? std::strerror(errno) : "no progress", ").");
    done += static_cast<size_t>(n);
  }
}

bool is_terminal(std::FILE* stream) {
  if (::isatty(::fileno(stream)) == 1) return true;
  const char* live = std::getenv("DATAPAR_LIVE_OUTPUT");  // set by datapar launch (worker_output.h)
  return stream == stdout && live != nullptr && std::string(live) == "1";
}

ProgressBar::ProgressBar(std::FILE* out, bool enabled) : out_(out), enabled_(enabled) {}

void ProgressBar::start(int64_t epoch, int64_t epochs, int64_t total_steps) {
  start("epoch " + std::to_string(epoch) + "/" + std::to_string(epochs), total_steps);
}

void ProgressBar::start(std::string label, int64_t total_steps) {
  label_ = std::move(label);
  total_ = total_steps;
  start_ = std::chrono::steady_clock::now();
  last_draw_ = {};
  drawn_ = false;
}

bool ProgressBar::due(int64_t steps) const {
  // Terminals are slow; 10 redraws a second look live and cost nothing.
  return enabled_ && (!drawn_ || steps >= total_ ||
                      std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100));
}

void ProgressBar::update(int64_t steps, double loss, int64_t samples) {
  if (!due(steps)) return;
  last_draw_ = std::chrono::steady_clock::now();
  draw(steps, loss, samples);
}

void ProgressBar::update(int64_t steps) {
  if (!due(steps)) return;
  last_draw_ = std::chrono::steady_clock::now();
  draw(steps, std::nan(""), -1);
}

void ProgressBar::draw(int64_t steps, double loss, int64_t samples) {
  constexpr int kWidth = 20;  // the whole line stays under 100 columns: a wrapped line is not redrawn in place
  const double done = total_ > 0 ? std::min(1.0, static_cast<double>(steps) / total_) : 1.0;
  const int filled = static_cast<int>(done * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // Time left at the epoch's pace so far.
  const double left = steps > 0 && total_ > steps ? secs / steps * (total_ - steps) : 0.0;
  char left_text[48];
  if (left >= 60) {
    std::snprintf(left_text, sizeof left_text, "%ld min %02ld s left", static_cast<long>(left) / 60,
                  static_cast<long>(left) % 60);
  } else {
    std::snprintf(left_text, sizeof left_text, "%.0f s left", left);
  }
  char rates[64] = "";  // what a training step shows, and a benchmark's does not
  if (samples >= 0) {
    std::snprintf(rates, sizeof rates, "  loss %.3f  %.0f samples/s", loss, secs > 0 ? samples / secs : 0.0);
  }
  std::fprintf(out_, "\r%s  step %" PRId64 "/%" PRId64 " [%s] %3.0f%%%s  %s\033[K", label_.c_str(), steps, total_,
               bar.c_str(), done * 100, rates, left_text);
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(out_, "\r\033[K");  // carriage return, erase to the end of the line
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace datapar::train
