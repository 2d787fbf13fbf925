// A launched fault-tolerant job's worker. See datapar/ft/launched_job.h.
#include "datapar/ft/launched_job.h"

#include <unistd.h>

#include "datapar/error.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/timeout.h"

namespace datapar::ft {

LaunchedJob join_launched_job(const JobConfig& config, int replica_group_size) {
  const FaultToleranceConfig launcher = config.fault_tolerant_launcher();
  const std::optional<ProcessIdentity> identity = config.identity();
  DATAPAR_CHECK(identity && identity->world_size >= 1,
                "--fault-tolerant: WORLD_SIZE is not set; datapar launch --fault-tolerant sets it.");
  DATAPAR_CHECK(config.master_addr && config.master_port, "--fault-tolerant: MASTER_ADDR and MASTER_PORT (where the ",
                "launcher serves the store) are not set.");
  const std::string& port = *config.master_port;
  DATAPAR_CHECK(!port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos &&
                    std::stoi(port) <= 65535,
                "--fault-tolerant: MASTER_PORT=\"", port, "\" is not a port number.");
  LaunchedJob job;
  job.world_size = identity->world_size;
  job.options = launched_job_options(launcher, job.world_size);
  DATAPAR_CHECK(replica_group_size >= 1 && job.world_size % replica_group_size == 0, "--fault-tolerant: replica ",
                "groups of ", replica_group_size, " do not divide the job's ", job.world_size, " ranks.");
  job.options.replica_group_size = replica_group_size;
  ReplicaSlot slot;
  if (replica_group_size > 1) slot = {identity->rank / replica_group_size, identity->rank % replica_group_size};
  job.store = std::make_shared<TcpStore>(
      TcpStoreOptions{*config.master_addr, static_cast<uint16_t>(std::stoi(port)), false,
                      config.store_token, kDefaultTimeout, config.run_id});
  GlooOptions gloo = gloo_job_options(config);
  gloo.timeout = launched_group_timeout(job.options);
  job.elastic = std::make_unique<ElasticGroup>(job.store, kLaunchedRun, job.options,
                                               [gloo](std::shared_ptr<Store> epoch_store, int rank, int size) {
                                                 return new_gloo_process_group(std::move(epoch_store), rank, size, gloo);
                                               },
                                               slot);
  job.store->set(launched_worker_key(kLaunchedRun, launcher.node_rank, static_cast<long>(::getpid())), job.elastic->member().id());
  return job;
}

}  // namespace datapar::ft
