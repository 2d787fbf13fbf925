// Ranks that are threads of the test, laid out for hybrid sharding: each makes its shard and
// replicate groups with hybrid_groups() as Gloo groups over loopback, one store for all.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "datapar/fsdp/hybrid_groups.h"
#include "datapar/process_group/gloo.h"
#include "datapar/rendezvous/prefix_store.h"
#include "testing/ports.h"

namespace datapar::testing {

// Runs fn(rank, groups, whole) on `world` threads, machines of `shard_size` consecutive
// ranks, `whole` a group of every rank; a rank's exception fails the test, naming it.
inline void run_hybrid_ranks(
    int world, int shard_size,
    const std::function<void(int, const HybridGroups&, const std::shared_ptr<ProcessGroup>&)>& fn) {
  using namespace std::chrono_literals;
  ThreadJobStore job(30s);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const std::shared_ptr<Store> store = job.join(rank);
        int made = 0;  // the groups of the layout so far: each its own store namespace
        const HybridGroups groups =
            hybrid_groups(rank, world, shard_size, [&](const std::vector<int>& ranks) -> std::shared_ptr<ProcessGroup> {
              const std::string prefix = "group/" + std::to_string(made++);
              const auto me = std::find(ranks.begin(), ranks.end(), rank);
              if (me == ranks.end()) return nullptr;
              return new_gloo_process_group(std::make_shared<PrefixStore>(prefix, store),
                                            static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                                            GlooOptions{"127.0.0.1", 30s});
            });
        const std::shared_ptr<ProcessGroup> whole = new_gloo_process_group(
            std::make_shared<PrefixStore>("group/whole", store), rank, world, GlooOptions{"127.0.0.1", 30s});
        fn(rank, groups, whole);
        groups.replicate->barrier()->wait();
        groups.shard->barrier()->wait();  // keeps rank 0's store up until everyone is done
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Runs fn(rank, groups) as above.
inline void run_hybrid_ranks(int world, int shard_size, const std::function<void(int, const HybridGroups&)>& fn) {
  run_hybrid_ranks(world, shard_size,
                   [&](int rank, const HybridGroups& groups, const std::shared_ptr<ProcessGroup>&) { fn(rank, groups); });
}

}  // namespace datapar::testing
