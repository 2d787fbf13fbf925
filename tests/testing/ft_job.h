// The fault-tolerant tests' jobs of three member processes (tests/ft/): the membership
// options (fast heartbeats and eviction, two members at least) and a member's connection to
// the test's store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "datapar/ft/membership/options.h"
#include "datapar/rendezvous/tcp_store.h"

namespace datapar::testing {

inline ft::FtOptions three_member_options() {
  using namespace std::chrono_literals;
  ft::FtOptions o;
  o.heartbeat_interval = 100ms;
  o.eviction_timeout = 1000ms;
  o.settle_time = 300ms;
  o.quorum_timeout = 15s;
  o.expected_members = 3;
  o.min_members = 2;
  return o;
}

inline std::shared_ptr<TcpStore> connect_member(uint16_t port, const std::string& token) {
  using namespace std::chrono_literals;
  return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", port, false, token, 5s, ""});
}

}  // namespace datapar::testing
