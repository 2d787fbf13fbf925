// RankBalancer: per-rank shares of each global batch for DDP ranks of unlike speed
// (`datapar train --mode ddp --balance auto`).
//
// Each rank reports, every step, the rows it ran and the seconds it computed them in
// (forward and backward, less the time backward waited for communication: a fast rank
// waiting for a slow one is not slow itself). Every `interval` steps the ranks all-reduce
// their sums, a collective every rank makes at the same step, and feed them to a
// LoadBalancer each (load_balancer.h). They feed identical numbers, so they agree on the
// shares without another message. Each rank's share of a global batch is then in
// proportion to its measured throughput (BalancedBatches hands the rows out), and DDP's
// average_by_samples keeps the gradient exactly the global batch's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "datapar/parallel/load_balancer.h"
#include "datapar/process_group/process_group.h"

namespace datapar {

struct RankBalancerOptions {
  // Steps between exchanges; each exchange is one measurement for the LoadBalancer.
  // REQUIRES: >= 1.
  int64_t interval = 2;
  LoadBalancerOptions balance;
};

class RankBalancer {
 public:
  // `group`: the job's ranks (null: the default group). Throws InvalidArgumentError for
  // options outside their REQUIRES.
  explicit RankBalancer(std::shared_ptr<ProcessGroup> group = nullptr, RankBalancerOptions options = {});

  // This rank's step: `rows` run in `seconds` of compute. Every `interval` calls it
  // exchanges with the other ranks (every rank must call it once per step) and returns
  // whether the shares changed. REQUIRES: rows >= 0, seconds finite and >= 0.
  bool step(int64_t rows, double seconds);

  // Each rank's share, summing to 1: the same on every rank.
  const std::vector<double>& weights() const { return balancer_.weights(); }
  const LoadBalancer& balancer() const { return balancer_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  RankBalancerOptions options_;
  LoadBalancer balancer_;
  int64_t steps_ = 0;
  int64_t rows_ = 0;      // since the last exchange
  double seconds_ = 0;    // since the last exchange
};

}  // namespace datapar
