// Stragglers named: one slow rank (a throttled card, a noisy neighbour, a bad link) sets every
// rank's pace, and the others wait for it in the collectives. Each rank tells the meter, per
// step, how long the step took and how long of it the rank waited for the others (its thread's
// Work::time_blocked_on_this_thread() over the step); the rest is its own work. Over a rolling window of steps,
// a rank whose own work per step is well above the others' is the straggler:
//
//   train::StragglerMeter meter;                 // the last 20 steps; named past 1.3x
//   ... each step: meter.step(step_seconds, waited_seconds);
//   const auto r = meter.report(*group);         // collective; e.g. at each epoch's end
//   if (r.straggler >= 0) std::printf("straggler: rank %d (%.2fx)\n", r.straggler, r.scores[r.straggler]);
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "datapar/process_group/process_group.h"

namespace datapar::train {

struct StragglerReport {
  std::vector<double> work_seconds;  // per rank: its own work per step (step minus waiting), window mean
  std::vector<double> wait_share;    // per rank: the share of its steps it waited for the others
  // Per rank: its work per step over the median of the other ranks' (1: as fast as they are).
  std::vector<double> scores;
  int straggler = -1;                // the rank with the highest score, if it reaches the threshold
};

class StragglerMeter {
 public:
  // `window`: the steps each report covers (the last ones); `threshold`: the score from which
  // the slowest rank is named. 1.3 names a rank 1.5x slower than the rest and none of the
  // noise of ranks sharing a machine (docs/benchmarks.md, "Stragglers named").
  explicit StragglerMeter(int64_t window = 20, double threshold = 1.3);

  // One step of this rank: how long it took, and how long of it the rank waited for others.
  void step(double seconds, double waited_seconds);
  // Collective over `group` (one all_reduce of 2 x size doubles): every rank's figures over
  // the window. Ranks with no step yet count as 0.
  StragglerReport report(ProcessGroup& group) const;

 private:
  int64_t window_;
  double threshold_;
  std::deque<std::pair<double, double>> steps_;  // (seconds, waited), the last `window_`
};

}  // namespace datapar::train
