// Ranks that are threads of the test, each a member of one Gloo group over loopback.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "datapar/process_group/gloo.h"
#include "datapar/process_group/process_group.h"
#include "testing/ports.h"

namespace datapar::testing {

// Runs fn(rank, group) on `size` threads, each a rank of one Gloo group made with
// options(rank); a rank's exception fails the test, naming it. `meet_at_end`: a barrier
// after fn (keeps rank 0's store up until everyone is done).
inline void run_gloo_ranks_with_options(int size, const std::function<GlooOptions(int)>& options,
                                        const std::function<void(int, std::shared_ptr<ProcessGroup>)>& fn,
                                        bool meet_at_end = true) {
  using namespace std::chrono_literals;
  ThreadJobStore job(30s);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto group = new_gloo_process_group(job.join(rank), rank, size, options(rank));
        fn(rank, group);
        if (meet_at_end) group->barrier()->wait();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

// The same over loopback with a 30 s timeout. `shared_memory`: GlooOptions::shared_memory
// (false: Gloo's TCP alone).
inline void run_gloo_ranks(int size, const std::function<void(int, std::shared_ptr<ProcessGroup>)>& fn,
                           bool shared_memory = true) {
  using namespace std::chrono_literals;
  run_gloo_ranks_with_options(size, [shared_memory](int) { return GlooOptions{"127.0.0.1", 30s, shared_memory}; }, fn);
}

}  // namespace datapar::testing
