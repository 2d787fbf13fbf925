// The options of a launched fault-tolerant job. See datapar/ft/membership/options.h.
#include "datapar/ft/membership/options.h"

#include <algorithm>

namespace datapar::ft {

using namespace std::chrono_literals;

FtOptions launched_job_options(const FaultToleranceConfig& launcher, int expected) {
  const std::chrono::milliseconds timeout = launcher.timeout;
  FtOptions o;
  o.eviction_timeout = timeout;
  o.heartbeat_interval = std::clamp<std::chrono::milliseconds>(timeout / 10, 20ms, 500ms);
  o.settle_time = std::clamp<std::chrono::milliseconds>(timeout / 5, 100ms, 1000ms);
  o.quorum_timeout = std::max<std::chrono::milliseconds>(60s, 4 * timeout);
  o.expected_members = expected;
  o.min_members = launcher.min_ranks;
  o.max_members = launcher.max_ranks;
  return o;
}

std::chrono::milliseconds launched_group_timeout(const FtOptions& options) {
  return std::max<std::chrono::milliseconds>(30s, 6 * options.eviction_timeout);
}

std::string launched_worker_key(const std::string& run, int node_rank, long pid) {
  return "ft/" + run + "/worker/" + std::to_string(node_rank) + "/" + std::to_string(pid);
}

}  // namespace datapar::ft
