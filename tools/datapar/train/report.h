// What rank 0 says of a run: the epoch line, the metrics file and the plot (Report), and
// the lines --balance prints when it moves the split.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../train.h"
#include "datapar/parallel/load_balancer.h"
#include "datapar/train/metrics.h"

namespace datapar::tools {

// What one epoch's training gave, summed (or, for times, the maximum) over the job.
struct EpochTotals {
  double loss_sum = 0, correct = 0, rows = 0;  // loss x rows, right answers, rows
  double seconds = 0, data_wait_seconds = 0;   // as long as its slowest rank
  std::vector<double> straggler_scores;         // ranks on CPU devices (train/stragglers.h)
  int straggler = -1;
};

// Rank 0's account of the run: an epoch line per epoch, the metrics file (a resumed
// run keeps the epochs before its checkpoint, so that the file and the plot cover the
// whole run) and the plot, redrawn every epoch so that a long run always has a current one.
class Report {
 public:
  // `writer`: this process reports (rank 0; under --fault-tolerant, see take_over()).
  Report(const TrainPlan& plan, int64_t first_epoch, bool writer);
  Report(const TrainPlan& plan, int64_t first_epoch) : Report(plan, first_epoch, plan.rank == 0) {}

  // This process reports from epoch `epoch` on. Under --fault-tolerant the reporter is each
  // epoch's rank 0, which can be another member each time: it takes the epochs before from
  // the metrics file the earlier reporters wrote (without --metrics, the plot shows the
  // epochs this member reported).
  void take_over(int64_t epoch);

  // `print`: the epoch line too (the fault-tolerant loop prints its own).
  void epoch(int64_t epoch, const EpochTotals& t, std::pair<int64_t, int64_t> test, double eval_seconds,
             bool print = true);

 private:
  const TrainPlan& plan_;
  std::vector<train::EpochMetrics> history_;
  std::unique_ptr<train::MetricsWriter> metrics_;
};

// Rank 0 says when --balance moves the split, and why. Each of the balancer's measurements
// covers `steps_per_measurement` steps (RankBalancer sums its interval).
void report_balance(const char* who, int64_t step, const std::vector<int64_t>& rows, const LoadBalancer& balancer,
                    int64_t steps_per_measurement = 1);

}  // namespace datapar::tools
