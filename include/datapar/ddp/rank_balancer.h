// RankBalancer: per-rank shares of each global batch for DDP ranks of unlike speed
// (`datapar train --mode ddp --balance auto`).
//
// Each rank reports, every step, the rows it ran and the seconds it computed them in
// (forward and backward, less the time backward waited for communication: a fast rank
// waiting for a slow one is not slow itself). Every `interval` steps the ranks all-reduce
// their sums, a collective every rank makes at the same step, and feed them to a
// LoadBalancer each (load_balancer.h). They feed identical numbers, so they agree on the
// shares without another message. The shares then make the ranks finish together, as
// their measured times predict (BalancedBatches hands the rows out), and DDP's
// average_by_samples keeps the gradient exactly the global batch's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "datapar/ddp/communication_stats.h"
#include "datapar/devices.h"
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

  // The measurement step() wants, for a step of DDP: begin_step() before the forward,
  // end_step() after the backward. The step's compute is the time between them, until
  // `device` has run all it was given (a GPU's queued work), less what backward waited for
  // the other ranks (`stats`: the DDP's communication_stats(), read at both ends; reading
  // them on a GPU waits for it, so call these only when balancing). end_step() calls
  // step() with it and returns what step() returns.
  //   balancer.begin_step(ddp.communication_stats(), device);
  //   loss_fn(ddp.forward(x), y).backward();
  //   if (balancer.end_step(x.size(0), ddp.communication_stats())) { /* new shares */ }
  void begin_step(const CommunicationStats& stats, const Device& device);
  bool end_step(int64_t rows, const CommunicationStats& stats);

  // Each rank's share, summing to 1: the same on every rank.
  const std::vector<double>& weights() const { return balancer_.weights(); }
  const LoadBalancer& balancer() const { return balancer_; }
  // Steps summed into each of the balancer's measurements.
  int64_t interval() const { return options_.interval; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  RankBalancerOptions options_;
  LoadBalancer balancer_;
  int64_t steps_ = 0;
  int64_t rows_ = 0;      // since the last exchange
  double seconds_ = 0;    // since the last exchange
  // Set by begin_step(), for end_step().
  std::optional<std::chrono::steady_clock::time_point> step_start_;
  std::chrono::nanoseconds waited_before_{0};
  Device step_device_ = Device::cpu(0);
};

}  // namespace datapar
