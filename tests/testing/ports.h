// A TCP port that was free a moment ago, for tests whose ranks must agree on a port in
// advance (rank 0's server takes it). Another process could grab it in between; on this
// test machine nothing else binds ports, and servers that can use port 0 do.
#pragma once

#include <chrono>
#include <cstdint>

#include "datapar/rendezvous/tcp_store.h"

namespace datapar::testing {

inline uint16_t free_port() {
  TcpStore probe({"127.0.0.1", 0, true, "", std::chrono::seconds(5)});
  return probe.port();
}

}  // namespace datapar::testing
