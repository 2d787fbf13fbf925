// LoadBalancer: the shares of a batch that make unlike devices (or ranks) finish a step
// together, found by measuring them.
//
// Each step, record() takes the rows every device ran and how long it was busy. A device's
// time per step is modelled as fixed + per_row x rows (Note [Fixed cost per step]); shares
// are then chosen so that every device that takes part finishes together, and a device
// whose fixed cost alone is longer than the step without it gets none.
//
// Note [Fixed cost per step]
// Seconds per row alone (the first model here) misjudges a device whose step has a part that
// does not shrink with its rows: a CPU beside a GPU refreshes its replica and runs every
// layer's overhead however few rows it gets, so it measured slower per row at every smaller
// share and sank to one row, which still cost the whole step 4x (docs/gpu.md, 0.25x). So
// each device keeps the median time at each of the last few row counts it ran (kept across
// changes of the split); a line through the current one and the one farthest from it in
// rows (at least a quarter apart) gives fixed and per_row. A time that does not grow with
// the rows is all fixed cost (per_row a thousandth of the current time per row); a line with
// a negative fixed cost (a device slower per row at more rows, or one whose speed changed
// since) falls back to seconds per row alone, as does a device with one point. The balanced
// split fills the step up to a common finish time T ("water-filling"): device i gets
// (T - fixed_i) / per_row_i rows when fixed_i < T, and none otherwise.
//
// A device left out is no longer measured, so its model could outlive what made it: every
// `probe_every` steps it gets a share again (seconds per row alone would give it) until
// measured, and stays only if it then earns one.
//
// Note [Hysteresis]
// The shares change only when the step, as the model predicts it (the latest finishing
// device), would be shorter by more than `hysteresis` (10%) under the balanced shares.
// Noise and small drift leave the split alone, so it does not flap; a device that became
// slower or faster moves it. After a change each device's seconds per row is measured
// afresh under the new split before the next decision.
//
// Note [Halfway back]
// Measured costs can depend on the split itself: two ranks that finish together overlap their
// communication with each other's compute, which slows the faster one's compute on a busy
// core. Moving all the way to each new measurement then swings the split back and forth
// (168, 152, 174, 155, ... rows of 256, measured). So a move against the previous one goes
// half as far as that one did; the split settles between the two instead of swinging, and
// once a move would change no share by 1% of the batch (min_move), it stays. A move that
// leaves a device out or takes one back in is made whole.
//
// Pure: no clock, no threads, no communication. DataParallel times its devices and calls
// it, and runs no replica on a device whose share is 0 but the first; `datapar train
// --balance auto` under DDP feeds it every rank's times, all-reduced, so every rank computes
// the same shares from the same numbers. Devices that run a row even with a share of 0 (the
// first of DataParallel, every DDP rank) are named in `takes_part`, so that the predicted
// step counts their fixed cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace datapar {

struct LoadBalancerOptions {
  // A device's cost is the median of its last `window` measurements. REQUIRES: >= 1.
  int64_t window = 5;
  // Measurements each device needs before a decision (the first, and after each change).
  // REQUIRES: 1 <= min_steps <= window.
  int64_t min_steps = 3;
  // Steps recorded but not measured at the start (allocations, caches warming up).
  // REQUIRES: >= 0.
  int64_t skip_steps = 1;
  // Re-split only when the predicted step shortens by more than this fraction (Note
  // [Hysteresis]). REQUIRES: >= 0.
  double hysteresis = 0.10;
  // A move that changes no share by at least this fraction of the batch is not made: it is
  // within the measurements' noise. REQUIRES: 0 <= min_move < 1.
  double min_move = 0.01;
  // Steps after which a device left out gets a share again, to be measured anew; 0: never.
  // REQUIRES: >= 0.
  int64_t probe_every = 500;
  // Devices that run at least a row whatever their share (empty: none). REQUIRES: empty or
  // one entry per device.
  std::vector<bool> takes_part;
};

class LoadBalancer {
 public:
  // `initial_weights`: the shares to start from (one per device, >= 0, some > 0); empty:
  // equal shares. Throws InvalidArgumentError for options outside their REQUIRES.
  explicit LoadBalancer(size_t devices, LoadBalancerOptions options = {}, std::vector<double> initial_weights = {});

  // One step: rows[i] rows ran on device i and kept it busy for seconds[i]. Devices that
  // ran no rows are not measured. Returns whether the shares changed.
  // REQUIRES: one entry per device; rows >= 0; seconds finite and >= 0.
  bool record(const std::vector<int64_t>& rows, const std::vector<double>& seconds);

  // The current shares, summing to 1 (for weighted_chunk_sizes); 0 for a device left out
  // (Note [Fixed cost per step]).
  const std::vector<double>& weights() const { return weights_; }
  // Each device's seconds per row as last measured (its window's median; after a re-split,
  // until measured again, the cost that decided it); 0 while never measured.
  const std::vector<double>& seconds_per_row() const { return latest_; }
  // Each device's fixed seconds per step in the model that decided the last split (0 where
  // none was seen, or before any decision).
  const std::vector<double>& fixed_seconds() const { return fixed_; }
  // Times the shares changed.
  int64_t rebalances() const { return rebalances_; }
  size_t devices() const { return weights_.size(); }
  const LoadBalancerOptions& options() const { return options_; }

 private:
  LoadBalancerOptions options_;
  std::vector<double> weights_;
  // A device's median time at one row count (Note [Fixed cost per step]).
  struct Point {
    int64_t rows = 0;
    std::deque<double> seconds;  // the last `window` steps at these rows
  };
  static constexpr size_t kPoints = 3;  // row counts kept per device, most recent first

  // fixed_[i] and per_row_[i] from device i's points (per_row_ 0: never measured).
  void fit(size_t i);

  std::vector<std::deque<double>> costs_;  // per device, its last `window` seconds per row
  std::vector<std::vector<Point>> points_;  // per device, most recently run first
  std::vector<double> fixed_;               // per device, the model: fixed seconds per step
  std::vector<double> per_row_;             // ... and seconds per row on top
  int64_t batch_rows_ = 0;                  // the largest batch recorded
  std::vector<double> latest_;             // per device, the median of its window when last measured
  std::vector<double> last_move_;          // the last change of weights_ (Note [Halfway back])
  std::vector<int64_t> left_out_since_;    // per device, the step it was left out at (-1: in)
  double move_scale_ = 1;                  // its length, relative to a full move
  int64_t recorded_ = 0;
  int64_t rebalances_ = 0;
};

}  // namespace datapar
