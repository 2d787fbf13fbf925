// The membership options of a fault-tolerant job (datapar/ft/, docs/fault_tolerance.md):
// `datapar launch --fault-tolerant` gives them to its decider, and every worker's
// `datapar train --fault-tolerant` to its member, so both derive them here from the same
// numbers, which the launcher passes to the workers in their environment:
//   DATAPAR_FAULT_TOLERANT=1        the launcher serves the store and decides membership
//   DATAPAR_FT_TIMEOUT_MS           --ft-timeout: a member silent this long is evicted
//   DATAPAR_FT_MIN_RANKS, DATAPAR_FT_MAX_RANKS   --min-ranks, --max-ranks
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include "datapar/ft/epoch.h"

namespace datapar::tools {

// The store's namespace of the job's membership (one job per store: the token and run id
// keep others out).
inline const std::string kFtRun = "job";

// Where a worker names its membership id for its launcher, which reports the member dead
// (ft::report_dead) the moment the worker's process exits with a failure: the others then go
// on at once instead of after the eviction timeout.
inline std::string ft_worker_key(const std::string& run, int node_rank, long pid) {
  return "ft/" + run + "/worker/" + std::to_string(node_rank) + "/" + std::to_string(pid);
}

// `expected`: the workers the first epoch waits for (every worker of every node).
inline ft::FtOptions ft_job_options(std::chrono::milliseconds timeout, int expected, int min_ranks, int max_ranks) {
  using namespace std::chrono_literals;
  ft::FtOptions o;
  o.eviction_timeout = timeout;
  o.heartbeat_interval = std::clamp<std::chrono::milliseconds>(timeout / 10, 20ms, 500ms);
  o.settle_time = std::clamp<std::chrono::milliseconds>(timeout / 5, 100ms, 1000ms);
  o.quorum_timeout = std::max<std::chrono::milliseconds>(60s, 4 * timeout);
  o.expected_members = expected;
  o.min_members = min_ranks;
  o.max_members = max_ranks;
  return o;
}

// The timeout of each membership epoch's process group (its connecting and every collective):
// a backstop, since a member that dies or hangs is noticed through the membership first (its
// launcher's report, the eviction timeout), which aborts the group. It bounds what an abort
// cannot end: connecting to a member that died while the group was being made.
inline std::chrono::milliseconds ft_group_timeout(const ft::FtOptions& options) {
  using namespace std::chrono_literals;
  return std::max<std::chrono::milliseconds>(30s, 6 * options.eviction_timeout);
}

}  // namespace datapar::tools
