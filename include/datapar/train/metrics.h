// Per-epoch training metrics and how they are shown: one plain line per epoch, JSON lines
// for programs, and a live progress bar for people at a terminal.
//
// This file only formats and writes; it computes nothing. The trainer (tools/datapar/
// train.cc) fills EpochMetrics, with counts already summed over all ranks, and only rank 0
// writes them. The plot of a run is in plot.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace datapar::train {

// What one epoch did. Rates are over the whole job (all devices or ranks).
struct EpochMetrics {
  int64_t epoch = 0;               // 1-based: the epoch just completed
  int64_t epochs = 0;              // epochs of the run (--epochs)
  double train_loss = 0;           // mean cross-entropy over the epoch's training samples
  double train_accuracy = 0;       // share of training samples classified right
  double test_accuracy = 0;        // test_correct / test_samples
  int64_t test_correct = 0;        // exact: every test sample counted once over all ranks
  int64_t test_samples = 0;
  int64_t train_samples = 0;       // samples trained on, all ranks (sampler padding included)
  double seconds = 0;              // wall time of the epoch's training (not evaluation)
  double samples_per_second = 0;   // train_samples / seconds
  double eval_seconds = 0;         // wall time of the evaluation after the epoch
  double data_wait_seconds = 0;    // time the training step waited for the loader (slowest rank)
  double data_wait_share = 0;      // data_wait_seconds / seconds
  std::string model;               // mlp, lenet, resnet18
  std::string mode;                // single, dp, ddp
  std::string devices;             // e.g. "cpu:0,cpu:1"
  int64_t world_size = 1;          // ranks (1 outside ddp and fsdp)
  int64_t batch_size = 0;          // global batch
  double lr = 0;                   // learning rate used (after --scale-lr)
  // Ranks on CPU devices: each rank's work per step over the median of the others' (the last
  // steps of the epoch, stragglers.h), and the rank named a straggler, or -1.
  std::vector<double> straggler_scores;
  int64_t straggler = -1;
};

// "epoch 3/10  loss 0.512  train acc 0.812  test acc 0.790  12.3 s  4870 samples/s  devices
// cpu:0,cpu:1 (ddp, 2 ranks)" with no trailing newline; `ranks`: whether the mode trains on
// ranks (the line then says how many). A straggler adds "  straggler: rank 1 (1.52x the
// others' work per step)".
std::string format_epoch_line(const EpochMetrics& m, bool ranks);

// One JSON object with every field of `m`, no trailing newline. Keys are the field names.
std::string to_json(const EpochMetrics& m);

// Reads back what to_json wrote (unknown keys are ignored, missing ones keep defaults).
// Throws InvalidArgumentError for a line that is not such an object.
EpochMetrics from_json(const std::string& line);

// Appends JSON lines to a file, one per epoch, flushed at once so a killed run keeps
// every completed epoch. append = false truncates first (a fresh run); true continues a
// resumed run's file. Throws InvalidArgumentError when the file cannot be opened, or is a
// symbolic link (never written through: someone may have planted it, issue 27).
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Throws InvalidArgumentError when the line cannot be written (a full disk).
  void write(const EpochMetrics& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Whether `stream` (stdout, stderr) is a terminal, or stands for one: a worker of `datapar
// launch` whose launcher writes to a terminal (DATAPAR_LIVE_OUTPUT=1; the launcher passes
// live lines through). The progress bar is drawn only then.
bool is_terminal(std::FILE* stream);

// A one-line progress bar redrawn in place with '\r', ended by "\033[K" (erase the rest):
//   epoch 2/10  step 11/24 [#########...........]  45%  loss 0.634  2310 samples/s  3 s left
// Disabled (every call a no-op) when `enabled` is false, e.g. when stdout is a file or a
// pipe, so logs hold only the per-epoch lines. Redraws at most every 100 ms. Not
// thread-safe; use from the training loop.
class ProgressBar {
 public:
  ProgressBar(std::FILE* out, bool enabled);
  // Starts a bar for `total_steps` steps of epoch `epoch` of `epochs`.
  void start(int64_t epoch, int64_t epochs, int64_t total_steps);
  // Starts a bar for `total_steps` steps labelled `label` (e.g. a benchmark's phase).
  void start(std::string label, int64_t total_steps);
  // Whether update(steps, ...) would redraw now. The loss lives on the training device:
  // the caller reads it (a wait for the device) only when it is due.
  bool due(int64_t steps) const;
  // After `steps` steps: the mean loss so far and samples trained so far.
  void update(int64_t steps, double loss, int64_t samples);
  // After `steps` steps, for steps that have no loss to show (a benchmark's).
  void update(int64_t steps);
  // Erases the bar, so the epoch line that follows starts on a clean line.
  void clear();

 private:
  void draw(int64_t steps, double loss, int64_t samples);

  std::FILE* out_;
  bool enabled_;
  std::string label_;  // "epoch E/N"
  int64_t total_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace datapar::train
