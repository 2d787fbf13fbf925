// The default process group. See distributed.h; the backends come from backends.cc.
#include "datapar/distributed.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "datapar/config.h"
#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/prefix_store.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/trace.h"
#include "process_group/backends.h"
#include "process_group/exit_order.h"
#include "uncaught_exception.h"
#include "trace/recorder.h"

namespace datapar {
namespace {

using detail::str_cat;

struct DefaultGroup {
  const detail::Backend* backend = nullptr;
  std::shared_ptr<Store> store;  // the job's store (mpi: served by rank 0 after the group is made)
  int rank = -1;
  int world_size = -1;
  detail::JobSettings settings;  // what every group of the job is made with
  std::shared_ptr<ProcessGroup> group;
  int groups_made = 0;  // new_group calls so far: names each group's store namespace
};

std::unique_ptr<DefaultGroup>& state() {
  static std::unique_ptr<DefaultGroup> s;
  return s;
}

std::atomic<bool>& exiting() {
  static std::atomic<bool> flag{false};  // trivially destructible: readable at any point of exit
  return flag;
}

DefaultGroup& require_state(const char* what) {
  DATAPAR_CHECK(state() != nullptr, what, ": no default process group. Call datapar::init_process_group() first.");
  return *state();
}

// Where rank 0 serves the store of a job that met without one (mpi): MASTER_ADDR if set,
// loopback when every process runs on this machine, else this machine's hostname.
std::string store_host(int world_size, const JobConfig& config) {
  if (config.master_addr) return *config.master_addr;
  const auto identity = config.identity();
  if (identity && identity->local_world_size == world_size) return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// The job's store for a backend whose processes met without one (mpirun started them):
// rank 0 serves a TcpStore on a free port and tells the others where, and its token,
// through `group` (a channel only the job's processes share, across machines too).
std::shared_ptr<Store> store_through(ProcessGroup& group, const JobConfig& config) {
  const std::chrono::milliseconds timeout = group.timeout();
  constexpr int64_t kSize = 1024;
  at::Tensor address = at::zeros({kSize}, at::kByte);  // "host port token", NUL-padded
  std::shared_ptr<Store> store;
  if (group.rank() == 0) {
    const std::string host = store_host(group.size(), config);
    const std::string token = !config.store_token.empty() ? config.store_token : make_store_token();
    auto server = std::make_shared<TcpStore>(TcpStoreOptions{host, 0, true, token, timeout, config.run_id});
    const std::string text = host + " " + std::to_string(server->port()) + " " + token;
    DATAPAR_CHECK(text.size() < kSize && token.find(' ') == std::string::npos, "init_process_group: the store's ",
                  "address ", host, ":", server->port(), " and DATAPAR_STORE_TOKEN make ", text.size(),
                  " bytes or the token has a space: use a token of letters and digits.");
    std::memcpy(address.data_ptr(), text.data(), text.size());
    store = server;
  }
  group.broadcast(address, 0)->wait();
  if (group.rank() != 0) {
    const std::string text(static_cast<const char*>(address.data_ptr()));
    const size_t token_at = text.rfind(' ');
    const size_t port_at = text.rfind(' ', token_at - 1);
    store = std::make_shared<TcpStore>(TcpStoreOptions{text.substr(0, port_at),
                                                       static_cast<uint16_t>(std::stoi(text.substr(port_at + 1))),
                                                       false, text.substr(token_at + 1), timeout, config.run_id});
  }
  return store;
}

// The group's own namespace in the job's store, or null without a store.
std::shared_ptr<Store> group_store(const DefaultGroup& s, const std::string& name) {
  return s.store ? std::make_shared<PrefixStore>(name, s.store) : nullptr;
}

}  // namespace

std::string default_backend() { return default_backend(resolve_job_config()); }

std::string default_backend(const JobConfig& config) {
  if (!config.backend.empty()) return config.backend;
  return DATAPAR_HAVE_MPI && config.under_mpi_launcher ? "mpi" : "gloo";
}

void init_process_group(const std::string& backend, const std::string& init_method, int rank, int world_size,
                        std::chrono::milliseconds timeout) {
  init_process_group(backend, init_method, rank, world_size, timeout, resolve_job_config());
}

void init_process_group(const std::string& backend, const std::string& init_method, int rank, int world_size,
                        std::chrono::milliseconds timeout, const JobConfig& config) {
  detail::exit_on_uncaught_exceptions();
  DATAPAR_CHECK(state() == nullptr, "init_process_group: a default process group exists already (rank ",
                state() ? state()->rank : -1, "). Call destroy_process_group() first.");
  auto s = std::make_unique<DefaultGroup>();
  const std::string name = backend.empty() ? default_backend(config) : backend;
  s->backend = &detail::find_backend(name);  // refuse before joining the job
  s->settings = {config, init_method, timeout};
  if (s->backend->job_shape) {
    // The launcher (mpirun) connected the processes already, and the backend knows rank
    // and world size: given ones must agree with it. The store comes after the group.
    const detail::JobShape shape = s->backend->job_shape();
    DATAPAR_CHECK((rank < 0 || rank == shape.rank) && (world_size < 0 || world_size == shape.world_size),
                  "init_process_group: rank ", rank, " and world size ", world_size, " were given, but ", name,
                  " says this process is rank ", shape.rank, " of ", shape.world_size, ". ",
                  shape.world_size == 1 && world_size > 1 ? "Start the job with mpirun -np N, which sets them; "
                                                          : "Start the job with mpirun, which sets them, and ",
                  "pass -1 (the default) for both.");
    s->rank = shape.rank;
    s->world_size = shape.world_size;
  } else {
    Rendezvous joined = rendezvous(init_method, rank, world_size, timeout, config);
    s->store = joined.store;
    s->rank = joined.rank;
    s->world_size = joined.world_size;
  }
  std::vector<int> everyone(s->world_size);
  for (int i = 0; i < s->world_size; ++i) everyone[i] = i;
  s->group = s->backend->make(group_store(*s, "group/default"), s->rank, everyone, s->settings);
  s->group->set_name("default");
  if (!s->store) {
    // The group came first (mpi): its stalls are inspected once the store is there, the one
    // inspector not added by the backend's assembly (process_group/assembly.h).
    s->store = store_through(*s->group, config);
    if (s->world_size > 1) s->group->inspect_stalls(group_store(*s, "group/default/stall"), kDefaultStallWarning);
  }
  state() = std::move(s);
  detail::release_default_group_at_exit();  // after nccl started CUDA (exit_order.h)
}

bool is_initialized() { return state() != nullptr; }

std::shared_ptr<ProcessGroup> default_group() { return require_state("default_group").group; }

std::shared_ptr<Store> default_store() { return require_state("default_store").store; }

int get_rank() { return require_state("get_rank").rank; }

int get_world_size() { return require_state("get_world_size").world_size; }

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) {
  DefaultGroup& s = require_state("new_group");
  const int world = s.world_size;
  DATAPAR_CHECK(!ranks.empty(), "new_group: no ranks given.");
  for (size_t i = 0; i < ranks.size(); ++i) {
    DATAPAR_CHECK(ranks[i] >= 0 && ranks[i] < world, "new_group: rank ", ranks[i], " is outside the job's [0, ",
                  world, ").");
    DATAPAR_CHECK(std::count(ranks.begin(), ranks.end(), ranks[i]) == 1, "new_group: rank ", ranks[i],
                  " is listed twice.");
  }
  const int id = s.groups_made++;  // the same on every process, which all call new_group in order
  const auto me = std::find(ranks.begin(), ranks.end(), s.rank);
  if (me == ranks.end()) return nullptr;
  const std::string name = "group/" + std::to_string(id);
  // Its stalls inspected through "<name>/stall", as its backend's factory assembles it.
  std::shared_ptr<ProcessGroup> group =
      s.backend->make(group_store(s, name), static_cast<int>(me - ranks.begin()), ranks, s.settings);
  group->set_name(name);
  return group;
}

namespace detail {

// A default group the program did not destroy, released without the barrier of
// destroy_process_group, which could wait the whole timeout for a rank that is gone.
void release_default_group_at_exit() {
  std::atexit([] {
    exiting().store(true);
    state().reset();
  });
}

bool process_exiting() { return exiting().load(); }

}  // namespace detail

void destroy_process_group() {
  if (!state()) return;
  auto s = std::move(state());
  // Everyone reaches this point before rank 0 takes the store server down with it.
  try {
    s->group->barrier()->wait(s->settings.timeout);
  } catch (const Error&) {
    // A peer is gone already: nothing left to protect.
  }
}

// The timeline of the default group's job (datapar/trace.h): defined here, where the default
// group is, so that the trace layer needs only a store and a rank.
void trace::save(const std::string& path) {
  if (!is_initialized()) return trace::detail::save_alone(path);
  const DefaultGroup& group = require_state("datapar::trace::save");
  trace::save(path, *group.store, group.rank, group.world_size);
}

}  // namespace datapar
