// Ports for tests, without the race of probing for a free one and releasing it (another
// process, e.g. a test running beside this one, could bind it in between).
//
// - ThreadJobStore: ranks that are threads of the test. Rank 0's server binds port 0 and
//   the other ranks connect to the port it got.
// - datapar::ReservedPort (datapar/rendezvous/reserved_port.h, which this includes): for the
//   few tests that must name a port before any server starts, because what they test takes
//   it from a URL or MASTER_PORT (tcp:// and env:// rendezvous, `datapar train` under
//   torchrun's variables): every rank needs the number up front, and rank 0 binds it itself.
// Multi-process jobs whose store is not what they test need no port: they rendezvous
// through a FileStore (file://) in a testing::TempDir, as ddp_test does.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <string>

#include "datapar/error.h"
#include "datapar/rendezvous/reserved_port.h"
#include "datapar/rendezvous/tcp_store.h"

namespace datapar::testing {

// The store of a job whose ranks are threads of one test: rank 0 hosts the TcpStore server
// on 127.0.0.1 port 0; the other ranks wait for the port it got and connect to it.
class ThreadJobStore {
 public:
  explicit ThreadJobStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // Rank `rank`'s connection; rank 0's also hosts the server, which stops when rank 0 lets
  // go of it. Rank 0 must call it exactly once. Thread-safe. Throws what rank 0's TcpStore
  // threw, on every rank; TimeoutError when rank 0 does not start within the timeout.
  std::shared_ptr<TcpStore> join(int rank) {
    if (rank == 0) {
      try {
        auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, "", timeout_});
        port_.set_value(server->port());
        return server;
      } catch (...) {
        port_.set_exception(std::current_exception());
        throw;
      }
    }
    if (server_port_.wait_for(timeout_) != std::future_status::ready) {
      throw TimeoutError("ThreadJobStore: rank " + std::to_string(rank) + " waited for rank 0's store server, " +
                         "which did not start within the timeout");
    }
    return std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", server_port_.get(), false, "", timeout_});
  }

 private:
  std::chrono::milliseconds timeout_;
  std::promise<uint16_t> port_;
  std::shared_future<uint16_t> server_port_ = port_.get_future().share();
};

}  // namespace datapar::testing
