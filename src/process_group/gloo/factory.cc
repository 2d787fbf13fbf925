// The Gloo backend's factory: new_gloo_process_group, Gloo's TCP transport assembled
// (assembly.h) with shared memory for the collectives of members that share a machine, and
// all-reduces in two levels for a group that spans machines (shared_memory_group.h); CUDA
// tensors staged through pinned host memory; the stall inspector. And the backend
// init_process_group makes it with.
#include <signal.h>
#include <unistd.h>

#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/prefix_store.h"
#include "process_group/assembly.h"
#include "process_group/backends.h"
#include "process_group/gloo/transport.h"

namespace datapar {
namespace {

// Note [SIGPIPE and Gloo]
// Gloo's TCP transport sends with writev(), which cannot be told MSG_NOSIGNAL: a send to a peer
// that has just died raises SIGPIPE, whose default action ends the process with no word. Under
// Python (PyTorch) SIGPIPE is ignored from the start, so the send fails with EPIPE and the
// group reports the peer; a C++ program must ignore it itself, or a survivor of a peer's
// death dies with it (seen: a fault-tolerant member killed by SIGPIPE when the members it had
// been evicted by closed their connections). Ignored here, at every group made (a forked
// child may have set it back), where the program set no handler of its own.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO)) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

std::shared_ptr<ProcessGroup> new_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     GlooOptions options) {
  ignore_sigpipe();  // Note [SIGPIPE and Gloo]
  GlooOptions leaders_options = options;
  leaders_options.shared_memory = false;
  std::shared_ptr<ProcessGroup> tcp = detail::new_gloo_tcp_group(store, rank, size, options);
  detail::Assembly assembly;
  assembly.meeting = detail::meeting_through(
      std::make_shared<PrefixStore>("shm", store), rank, size,
      [leaders_options](std::shared_ptr<Store> leaders_store, int leader, int leaders) {
        return detail::new_gloo_tcp_group(std::move(leaders_store), leader, leaders, leaders_options);
      });
  assembly.shared_memory = options.shared_memory;
  assembly.timeout = options.timeout;
  assembly.stage_cuda = true;
  assembly.stall_store = std::make_shared<PrefixStore>("stall", std::move(store));
  assembly.stall_warning = options.stall_warning;
  return detail::assemble(std::move(tcp), std::move(assembly));
}

namespace detail {
namespace {

// The address other processes reach this one on, for Gloo's transport:
// DATAPAR_GLOO_HOSTNAME, else loopback for a job whose store is on loopback, else this
// machine's hostname.
std::string gloo_hostname(const std::string& init_method, const JobConfig& config) {
  if (config.gloo_hostname) return *config.gloo_hostname;
  std::string host;
  if (init_method.rfind("tcp://", 0) == 0) host = parse_init_method(init_method).host;
  if (init_method == "env://" && config.master_addr) host = *config.master_addr;
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

Backend gloo_backend() {
  Backend b;
  b.name = "gloo";
  b.make = [](std::shared_ptr<Store> store, int rank, const std::vector<int>& ranks, const JobSettings& job) {
    GlooOptions options = gloo_job_options(job.config, job.init_method);
    options.timeout = job.timeout;
    return new_gloo_process_group(std::move(store), rank, static_cast<int>(ranks.size()), options);
  };
  return b;
}

}  // namespace detail

GlooOptions gloo_job_options(const JobConfig& config, const std::string& init_method) {
  GlooOptions options;
  options.hostname = detail::gloo_hostname(init_method, config);
  options.shared_memory = config.gloo_shared_memory;
  return options;
}
}  // namespace datapar
