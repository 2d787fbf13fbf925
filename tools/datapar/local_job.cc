#include "local_job.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/tcp_store.h"

namespace datapar::tools {

int run_job(int nproc, const std::string& tool, const std::function<int(const std::string&, int, int)>& rank_main) {
  DATAPAR_CHECK(nproc >= 1, "--nproc must be at least 1.");
  if (const auto identity = identity_from_environment()) {  // under a launcher
    return rank_main("env://", identity->rank, identity->world_size);
  }
  uint16_t port;
  {
    TcpStore probe({"127.0.0.1", 0, true, "", std::chrono::seconds(5)});
    port = probe.port();
  }
  const std::string init_method = "tcp://127.0.0.1:" + std::to_string(port);
  std::vector<pid_t> children;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = rank_main(init_method, rank, nproc);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: rank %d: %s\n", tool.c_str(), rank, e.what());
      }
      std::fflush(nullptr);
      std::_Exit(code);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failed ? 1 : 0;
}

}  // namespace datapar::tools
