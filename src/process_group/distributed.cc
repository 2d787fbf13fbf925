// The default process group and the backend factory. See distributed.h.
#include "datapar/distributed.h"

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "datapar/config.h"
#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/prefix_store.h"

namespace datapar {
namespace {

using detail::str_cat;

struct DefaultGroup {
  Rendezvous rendezvous;
  std::string backend;
  std::chrono::milliseconds timeout{};
  std::string gloo_hostname;
  std::shared_ptr<ProcessGroup> group;
  int groups_made = 0;  // new_group calls so far: names each group's store namespace
};

std::unique_ptr<DefaultGroup>& state() {
  static std::unique_ptr<DefaultGroup> s;
  return s;
}

DefaultGroup& require_state(const char* what) {
  DATAPAR_CHECK(state() != nullptr, what, ": no default process group. Call datapar::init_process_group() first.");
  return *state();
}

// The address other processes reach this one on, for Gloo's transport:
// DATAPAR_GLOO_HOSTNAME, else loopback for a job whose store is on loopback, else this
// machine's hostname.
std::string gloo_hostname(const std::string& init_method) {
  if (const char* given = std::getenv("DATAPAR_GLOO_HOSTNAME")) return given;
  std::string host;
  if (init_method.rfind("tcp://", 0) == 0) host = parse_init_method(init_method).host;
  if (init_method == "env://") {
    if (const char* addr = std::getenv("MASTER_ADDR")) host = addr;
  }
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Throws unless this build has `backend`.
void check_backend(const std::string& backend) {
  if (backend == "gloo") return;
  if (backend == "nccl" || backend == "mpi") {
    throw InvalidArgumentError(str_cat("init_process_group: the ", backend,
                                       " backend is not available in this build of datapar (", backend == "nccl" ?
                                       "it needs libtorch with CUDA and is not implemented yet" : "not implemented yet",
                                       "). Use \"gloo\" for CPU tensors."));
  }
  throw InvalidArgumentError(str_cat("init_process_group: unknown backend \"", backend,
                                     "\". Available in this build: gloo."));
}

std::shared_ptr<ProcessGroup> make_group(const std::string& backend, std::shared_ptr<Store> store, int rank, int size,
                                         const DefaultGroup& settings) {
  check_backend(backend);  // only gloo gets past it
  return new_gloo_process_group(std::move(store), rank, size, GlooOptions{settings.gloo_hostname, settings.timeout});
}

}  // namespace

void init_process_group(const std::string& backend, const std::string& init_method, int rank, int world_size,
                        std::chrono::milliseconds timeout) {
  DATAPAR_CHECK(state() == nullptr, "init_process_group: a default process group exists already (rank ",
                state() ? state()->rendezvous.rank : -1, "). Call destroy_process_group() first.");
  check_backend(backend);  // refuse before joining the job
  auto s = std::make_unique<DefaultGroup>();
  s->backend = backend;
  s->timeout = timeout;
  s->gloo_hostname = gloo_hostname(init_method);
  s->rendezvous = rendezvous(init_method, rank, world_size, timeout);
  s->group = make_group(backend, std::make_shared<PrefixStore>("group/default", s->rendezvous.store),
                        s->rendezvous.rank, s->rendezvous.world_size, *s);
  state() = std::move(s);
}

bool is_initialized() { return state() != nullptr; }

std::shared_ptr<ProcessGroup> default_group() { return require_state("default_group").group; }

std::shared_ptr<Store> default_store() { return require_state("default_store").rendezvous.store; }

int get_rank() { return require_state("get_rank").rendezvous.rank; }

int get_world_size() { return require_state("get_world_size").rendezvous.world_size; }

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) {
  DefaultGroup& s = require_state("new_group");
  const int world = s.rendezvous.world_size;
  DATAPAR_CHECK(!ranks.empty(), "new_group: no ranks given.");
  for (size_t i = 0; i < ranks.size(); ++i) {
    DATAPAR_CHECK(ranks[i] >= 0 && ranks[i] < world, "new_group: rank ", ranks[i], " is outside the job's [0, ",
                  world, ").");
    DATAPAR_CHECK(std::count(ranks.begin(), ranks.end(), ranks[i]) == 1, "new_group: rank ", ranks[i],
                  " is listed twice.");
  }
  const int id = s.groups_made++;  // the same on every process, which all call new_group in order
  const auto me = std::find(ranks.begin(), ranks.end(), s.rendezvous.rank);
  if (me == ranks.end()) return nullptr;
  return make_group(s.backend, std::make_shared<PrefixStore>("group/" + std::to_string(id), s.rendezvous.store),
                    static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), s);
}

void destroy_process_group() {
  if (!state()) return;
  auto s = std::move(state());
  // Everyone reaches this point before rank 0 takes the store server down with it.
  try {
    s->group->barrier()->wait(s->timeout);
  } catch (const Error&) {
    // A peer is gone already: nothing left to protect.
  }
}

}  // namespace datapar
