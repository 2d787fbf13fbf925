// init_method parsing, launcher environments and the join. See init_method.h.
//
// The join (Note [Join]):
//   a. rank r claims "rendezvous/rank/r" with compare_set(empty -> its id: host, pid, a
//      random number). Getting another id back means a second process has this rank.
//   b. compare_set("rendezvous/world_size", empty -> W): the first W wins; anyone with
//      another W is told which one the job agreed on.
//   c. add("rendezvous/joined", 1); whoever brings it to W sets "rendezvous/complete".
//   d. Everyone waits for "rendezvous/complete"; on timeout the error names the ranks
//      whose claim (a) never appeared.
//   e. Everyone counts itself through with add("rendezvous/through", 1), and the last sets
//      "rendezvous/all_through". Rank 0 hosts the TCP server, so it returns only after
//      that: otherwise it could drop the store while others are still reading step d.
#include "datapar/rendezvous/init_method.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <sstream>

#include "datapar/error.h"
#include "datapar/rendezvous/file_store.h"
#include "datapar/rendezvous/tcp_store.h"

namespace datapar {
namespace {

using detail::str_cat;

const char kFormats[] = "Use env://, tcp://HOST:PORT or file:///ABSOLUTE/PATH.";

uint16_t parse_port(const std::string& text, const std::string& url) {
  DATAPAR_CHECK(!text.empty() && text.size() <= 5 && text.find_first_not_of("0123456789") == std::string::npos,
                "init_method \"", url, "\": \"", text, "\" is not a port number. ", kFormats);
  const int port = std::stoi(text);
  DATAPAR_CHECK(port >= 1 && port <= 65535, "init_method \"", url, "\": port ", port,
                " is outside 1..65535. ", kFormats);
  return static_cast<uint16_t>(port);
}

std::string process_id() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device random;
  return str_cat(host, ":", ::getpid(), ":", random());
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Without a token, the store makes one that only this machine's processes can read (Note
// [Token] in store_token.h). A job whose launcher says it spans machines cannot use that:
// every rank refuses at once, rather than the remote ones failing and rank 0 timing out.
void refuse_across_machines(const std::string& host, int world_size, const JobConfig& config) {
  if (is_loopback(host)) return;
  // Unknown (no launcher, or variables that do not parse): the store itself refuses a client
  // on another machine.
  const std::optional<ProcessIdentity>& identity = config.launcher;
  if (!identity || identity->local_world_size <= 0 || identity->local_world_size >= world_size) return;
  throw InvalidArgumentError(str_cat(
      "rendezvous: this job runs on several machines (", identity->source, " says ", identity->local_world_size,
      " of its ", world_size, " processes run here) but has no store token, and a token made here could not reach ",
      "the others. Give every process the same secret: export DATAPAR_STORE_TOKEN=$(openssl rand -hex 16) on every ",
      "node before starting it, or start it with datapar launch --token-file FILE."));
}

}  // namespace

InitMethod parse_init_method(const std::string& url) {
  InitMethod method;
  if (url == "env://") return method;
  if (url.rfind("tcp://", 0) == 0) {
    method.kind = InitMethod::Kind::kTcp;
    const std::string rest = url.substr(6);
    size_t colon;
    if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
      const size_t close = rest.find(']');
      DATAPAR_CHECK(close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':', "init_method \"",
                    url, "\": write an IPv6 address as [ADDRESS]:PORT. ", kFormats);
      method.host = rest.substr(1, close - 1);
      colon = close + 1;
    } else {
      colon = rest.rfind(':');
      DATAPAR_CHECK(colon != std::string::npos && colon > 0, "init_method \"", url,
                    "\": a tcp:// init method needs HOST:PORT. ", kFormats);
      method.host = rest.substr(0, colon);
    }
    method.port = parse_port(rest.substr(colon + 1), url);
    return method;
  }
  if (url.rfind("file://", 0) == 0) {
    method.kind = InitMethod::Kind::kFile;
    method.path = url.substr(7);
    DATAPAR_CHECK(!method.path.empty() && method.path[0] == '/', "init_method \"", url,
                  "\": a file:// init method needs an absolute path, as in file:///shared/job/store. ", kFormats);
    return method;
  }
  throw InvalidArgumentError(str_cat("init_method \"", url, "\" is not a URL datapar knows. ", kFormats));
}

Rendezvous rendezvous(const std::string& init_method, int rank, int world_size, std::chrono::milliseconds timeout,
                      const Environment& env) {
  return rendezvous(init_method, rank, world_size, timeout, resolve_job_config(env));
}

Rendezvous rendezvous(const std::string& init_method, int rank, int world_size, std::chrono::milliseconds timeout,
                      const JobConfig& config) {
  InitMethod method = parse_init_method(init_method);
  if (rank < 0 || world_size < 0) {
    const auto identity = config.identity();
    DATAPAR_CHECK(identity.has_value(), "rendezvous: rank and world size are unknown. Pass them, or start the ",
                  "processes with datapar launch, torchrun, mpirun or srun, which set them.");
    if (rank < 0) rank = identity->rank;
    if (world_size < 0) world_size = identity->world_size;
  }
  DATAPAR_CHECK(world_size >= 1, "rendezvous: world size ", world_size, " must be at least 1.");
  DATAPAR_CHECK(rank >= 0 && rank < world_size, "rendezvous: rank ", rank, " is outside [0, ", world_size,
                "). Ranks run from 0 to world size - 1.");

  Rendezvous result;
  result.rank = rank;
  result.world_size = world_size;
  if (method.kind == InitMethod::Kind::kEnv) {
    const auto& addr = config.master_addr;
    const auto& port = config.master_port;
    DATAPAR_CHECK(addr && port, "rendezvous: env:// needs MASTER_ADDR and MASTER_PORT (rank 0's address and a ",
                  "free port); ", addr ? "MASTER_PORT" : "MASTER_ADDR", " is not set.");
    method.host = *addr;
    method.port = parse_port(*port, "env:// MASTER_PORT");
  }
  if (method.kind == InitMethod::Kind::kFile) {
    const size_t slash = method.path.find_last_of('/');
    const std::string dir = slash == 0 ? "/" : method.path.substr(0, slash);
    struct stat st;
    DATAPAR_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "rendezvous: the directory ", dir, " of ",
                  init_method, " does not exist. Create it on a filesystem every process can reach.");
    result.store = std::make_shared<FileStore>(method.path, FileStoreOptions{world_size, config.run_id, timeout});
  } else {
    TcpStoreOptions options;
    options.host = method.host;
    options.port = method.port;
    options.is_server = rank == 0;
    options.timeout = timeout;
    options.token = config.store_token;
    options.run_id = config.run_id;
    if (options.token.empty()) refuse_across_machines(method.host, world_size, config);
    result.store = std::make_shared<TcpStore>(options);
  }
  Store& store = *result.store;

  // Note [Join], a-d.
  const std::string me = process_id();
  const std::string rank_key = "rendezvous/rank/" + std::to_string(rank);
  const Bytes mine(me.begin(), me.end());
  const Bytes holder = store.compare_set(rank_key, {}, mine);
  DATAPAR_CHECK(holder == mine, "rendezvous: rank ", rank, " is claimed by two processes (",
                std::string(holder.begin(), holder.end()), " and ", me, "). Give every process its own rank.");
  const std::string size_text = std::to_string(world_size);
  const Bytes agreed = store.compare_set("rendezvous/world_size", {}, Bytes(size_text.begin(), size_text.end()));
  DATAPAR_CHECK(std::string(agreed.begin(), agreed.end()) == size_text, "rendezvous: rank ", rank,
                " has world size ", world_size, " but the job agreed on ", std::string(agreed.begin(), agreed.end()),
                ". Start every process with the same world size.");
  if (store.add("rendezvous/joined", 1) == world_size) store.set("rendezvous/complete", "1");
  try {
    store.wait({"rendezvous/complete"}, timeout);
  } catch (const TimeoutError&) {
    std::ostringstream missing;
    int count = 0;
    for (int r = 0; r < world_size; ++r) {
      if (!store.check({"rendezvous/rank/" + std::to_string(r)})) {
        if (count++ < 16) missing << (count > 1 ? ", " : "") << r;
      }
    }
    if (count > 16) missing << " and " << count - 16 << " more";
    throw TimeoutError(str_cat("rendezvous: rank ", rank, " waited ", std::chrono::duration<double>(timeout).count(),
                               " s at ", init_method, " but ", count, " of ", world_size, " ranks never arrived (",
                               missing.str(), "). Did they start, with the same init method? Raise the timeout if they are slow."));
  }
  if (store.add("rendezvous/through", 1) == world_size) store.set("rendezvous/all_through", "1");
  if (rank == 0) store.wait({"rendezvous/all_through"}, timeout);
  return result;
}

}  // namespace datapar
