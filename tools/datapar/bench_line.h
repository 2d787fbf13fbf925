// What a person at a terminal sees while `datapar bench ddp` or `datapar bench fsdp` runs
// (issue 44): rank 0 redraws one line in place for each timed phase,
//   ddp  step 40/120 [######..............]  33%  4 s left
// and erases it before the results. Piped or to a file nothing is drawn: the tables are the
// output (and the figures in docs/benchmarks.md come from such runs). At a terminal the line
// costs a clock read per step and a redraw at most every 100 ms.
#pragma once

#include <cstdio>
#include <string>

#include "datapar/process_group/process_group.h"
#include "datapar/train/metrics.h"

namespace datapar::tools {

class BenchLine {
 public:
  explicit BenchLine(const ProcessGroup& group) : bar_(stdout, group.rank() == 0 && train::is_terminal(stdout)) {}
  ~BenchLine() { bar_.clear(); }
  BenchLine(const BenchLine&) = delete;
  BenchLine& operator=(const BenchLine&) = delete;

  // Starts phase `name` of `steps` steps (warm-up included).
  void phase(std::string name, int steps) {
    bar_.start(std::move(name), steps);
    bar_.update(0);
  }
  // `done` steps of the phase are done.
  void step(int done) { bar_.update(done); }
  // Erases the line, before the results are printed.
  void clear() { bar_.clear(); }

 private:
  train::ProgressBar bar_;
};

}  // namespace datapar::tools
