// Launcher environments and the job's configuration. See job_config.h.
#include "datapar/rendezvous/job_config.h"

#include <cerrno>
#include <cstdlib>

#include "datapar/error.h"

namespace datapar {
namespace {

std::optional<int> read_int(const Environment& env, const std::string& name) {
  const auto value = env(name);
  if (!value) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value->c_str(), &end, 10);
  DATAPAR_CHECK(!value->empty() && errno == 0 && *end == '\0' && v >= -1 && v < (1L << 30), name, "=\"", *value,
                "\" is not a valid integer.");
  return static_cast<int>(v);
}

// Unset or anything but "0": on.
bool switched_on(const Environment& env, const std::string& name) { return env(name).value_or("1") != "0"; }

}  // namespace

std::optional<ProcessIdentity> identity_from_environment(const Environment& env) {
  struct Launcher {
    const char* source;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  for (const Launcher& l : {Launcher{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                            Launcher{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                            Launcher{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}}) {
    const auto rank = read_int(env, l.rank);
    const auto size = read_int(env, l.size);
    if (!rank || !size) continue;
    ProcessIdentity identity;
    identity.rank = *rank;
    identity.world_size = *size;
    identity.local_rank = read_int(env, l.local_rank).value_or(-1);
    // SLURM_NTASKS_PER_NODE may read "4(x2)": take what parses, else unknown.
    try {
      identity.local_world_size = read_int(env, l.local_size).value_or(-1);
    } catch (const InvalidArgumentError&) {
      identity.local_world_size = -1;
    }
    identity.source = l.source;
    return identity;
  }
  return std::nullopt;
}

std::optional<ProcessIdentity> JobConfig::identity() const {
  if (!launcher_error.empty()) throw InvalidArgumentError(launcher_error);
  return launcher;
}

FaultToleranceConfig JobConfig::fault_tolerant_launcher() const {
  DATAPAR_CHECK(fault_tolerance.has_value(), "this process was not started by datapar launch --fault-tolerant "
                "(DATAPAR_FAULT_TOLERANT is not 1).\n---> HINT: datapar launch --fault-tolerant --nproc-per-node N "
                "-- PROGRAM ...");
  if (!fault_tolerance_error.empty()) throw InvalidArgumentError(fault_tolerance_error);
  return *fault_tolerance;
}

JobConfig resolve_job_config(const Environment& env) {
  JobConfig config;
  try {
    config.launcher = identity_from_environment(env);
  } catch (const InvalidArgumentError& e) {
    config.launcher_error = e.what();
  }
  config.master_addr = env("MASTER_ADDR");
  config.master_port = env("MASTER_PORT");
  config.store_token = env("DATAPAR_STORE_TOKEN").value_or("");
  // DATAPAR_RUN_ID wins even when set empty, as FileStore has always read it.
  config.run_id = env("DATAPAR_RUN_ID").value_or(config.store_token);
  config.backend = env("DATAPAR_BACKEND").value_or("");
  config.under_mpi_launcher = env("OMPI_COMM_WORLD_SIZE").has_value() || env("PMI_SIZE").has_value();
  config.gloo_hostname = env("DATAPAR_GLOO_HOSTNAME");
  config.gloo_shared_memory = switched_on(env, "DATAPAR_SHM");
  config.mpi_shared_memory = switched_on(env, "DATAPAR_MPI_SHM");
  config.nccl_end_process_on_failure = switched_on(env, "DATAPAR_NCCL_END_PROCESS_ON_FAILURE");
  config.local_rank = env("LOCAL_RANK");
  if (env("DATAPAR_FAULT_TOLERANT") == std::optional<std::string>("1")) {
    FaultToleranceConfig& ft = config.fault_tolerance.emplace();
    try {
      const auto required = [&](const char* name) {
        const std::optional<int> v = read_int(env, name);
        DATAPAR_CHECK(v && *v >= 0, name, " is not set; datapar launch --fault-tolerant sets it.");
        return *v;
      };
      ft.timeout = std::chrono::milliseconds(required("DATAPAR_FT_TIMEOUT_MS"));
      ft.min_ranks = required("DATAPAR_FT_MIN_RANKS");
      ft.max_ranks = required("DATAPAR_FT_MAX_RANKS");
      ft.node_rank = read_int(env, "GROUP_RANK").value_or(0);
    } catch (const InvalidArgumentError& e) {
      config.fault_tolerance_error = e.what();
    }
  }
  return config;
}

}  // namespace datapar
