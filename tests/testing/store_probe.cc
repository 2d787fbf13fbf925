// A process of a test job, for tests that need real processes. Modes:
//   store_probe INIT_METHOD RANK WORLD_SIZE
//       joins the rendezvous at INIT_METHOD as RANK of WORLD_SIZE, swaps a value with every
//       other rank through the store, and exits 0 if all went well (e.g. across network
//       namespaces, or torchrun-style jobs without a token).
//   store_probe serve TOKEN
//       serves a TcpStore on 127.0.0.1 (a free port, printed as "port N") until its stdin
//       closes: a server whose memory a test can measure alone (/proc/PID/status).
//   store_probe connect PORT TOKEN TIMEOUT_MS
//       connects a TcpStore client to 127.0.0.1:PORT and prints "error: ..." or "connected",
//       then "growth_kib N": how far its peak resident memory rose meanwhile.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <string>

#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/tcp_store.h"

namespace {

// VmHWM, the peak resident set, in KiB.
long peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

int serve(const std::string& token) {
  datapar::TcpStore server({"127.0.0.1", 0, true, token, std::chrono::seconds(30)});
  std::cout << "port " << server.port() << std::endl;
  char byte;
  while (::read(0, &byte, 1) > 0) {
  }
  return 0;
}

int connect(uint16_t port, const std::string& token, int timeout_ms) {
  const long before = peak_rss_kib();
  try {
    datapar::TcpStore client({"127.0.0.1", port, false, token, std::chrono::milliseconds(timeout_ms)});
    std::cout << "connected\n";
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << "\n";
  }
  std::cout << "growth_kib " << peak_rss_kib() - before << std::endl;
  return 0;
}

int join(const std::string& init_method, int rank, int world_size) {
  datapar::Rendezvous rdzv = datapar::rendezvous(init_method, rank, world_size, std::chrono::seconds(30));
  rdzv.store->set("probe/" + std::to_string(rank), "hello from " + std::to_string(rank));
  for (int r = 0; r < world_size; ++r) {
    if (rdzv.store->get_string("probe/" + std::to_string(r)) != "hello from " + std::to_string(r)) return 3;
  }
  // Rank 0 hosts the server: it leaves last, once everyone has read.
  if (rdzv.store->add("probe/done", 1) == world_size) rdzv.store->set("probe/all_done", "1");
  if (rank == 0) rdzv.store->wait({"probe/all_done"});
  std::cout << "store_probe: rank " << rank << " of " << world_size << " ok\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "serve" && argc == 3) return serve(argv[2]);
    if (mode == "connect" && argc == 5) {
      return connect(static_cast<uint16_t>(std::stoi(argv[2])), argv[3], std::stoi(argv[4]));
    }
    if (argc == 4) return join(argv[1], std::stoi(argv[2]), std::stoi(argv[3]));
    std::cerr << "usage: store_probe INIT_METHOD RANK WORLD_SIZE | serve TOKEN | connect PORT TOKEN TIMEOUT_MS\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "store_probe: " << e.what() << "\n";
    return 1;
  }
}
