// A fault-tolerant job's membership options (docs/fault_tolerance.md): FtOptions, how a job
// started by `datapar launch --fault-tolerant` derives them from the launcher's numbers (the
// launcher for its decider, each worker for its member: the same function on both sides),
// and the store keys the launcher and its workers share.
#pragma once

#include <chrono>
#include <limits>
#include <string>

#include "datapar/rendezvous/job_config.h"

namespace datapar::ft {

struct FtOptions {
  // How often a member renews its heartbeat, and the decider looks.
  std::chrono::milliseconds heartbeat_interval{500};
  // A member whose heartbeat stopped this long is evicted (dead, hung, or stopped by a
  // signal); its epoch is marked broken, so the others abort their collectives at once.
  std::chrono::milliseconds eviction_timeout{5000};
  // A new epoch waits this long after the last join for more members, once it could form.
  std::chrono::milliseconds settle_time{1000};
  // The longest wait for a quorum; then the job stops with MembershipError. A member's join
  // waits a little longer (the settle time and four heartbeats) for the decider's verdict.
  std::chrono::milliseconds quorum_timeout{60000};
  // Members the first epoch waits for (up to quorum_timeout); 0: min_members.
  int expected_members = 0;
  int min_members = 1;
  int max_members = std::numeric_limits<int>::max();
  // Members per replica group (HSDP's shard group: ft::FaultTolerantFsdp shards over each
  // and replicates across them). An epoch takes whole groups only: a group that lost a
  // member leaves the job as a whole, its other members waiting in join() until a
  // replacement fills the slot (ReplicaSlot). 1: every member is a group of its own. 0,
  // for a decider only (the launcher's): as the members say when they ask to join.
  int replica_group_size = 1;
};

// The options of a job of `expected` members (every worker of every node) under
// `datapar launch --fault-tolerant`: the heartbeat a tenth of the eviction timeout
// (20-500 ms), the settle time a fifth (0.1-1 s), the quorum timeout 4 timeouts (at least 60 s).
FtOptions launched_job_options(const FaultToleranceConfig& launcher, int expected);

// The timeout of each membership epoch's process group (its connecting and every
// collective): a backstop, since a member that dies or hangs is noticed through the
// membership first (its launcher's report, the eviction timeout), which aborts the group. It
// bounds what an abort cannot end: connecting to a member that died while the group was
// being made. 6 eviction timeouts, at least 30 s.
std::chrono::milliseconds launched_group_timeout(const FtOptions& options);

// The store's namespace of a launched job's membership (one job per store: the token and run
// id keep others out).
inline const std::string kLaunchedRun = "job";

// Where a worker names its membership id for its launcher, which reports the member dead
// (report_dead) the moment the worker's process exits with a failure: the others then go on
// at once instead of after the eviction timeout.
std::string launched_worker_key(const std::string& run, int node_rank, long pid);

}  // namespace datapar::ft
