#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "child_process.h"
#include "datapar/error.h"
#include "datapar/process_group/gloo.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/tcp_store.h"
#include "testing/conformance.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"
#include "testing/ports.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

std::optional<std::string> no_env(const std::string&) { return std::nullopt; }

// Runs fn(rank, group) on `size` threads, each a rank of one Gloo group over loopback.
void spawn(int size, const std::function<void(int, ProcessGroup&)>& fn) {
  testing::run_gloo_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) { fn(rank, *group); });
}

// The conformance suite (testing/conformance.h) over Gloo's TCP alone, at world sizes 1-4;
// shared_memory_test runs it through the shared-memory layer.
TEST(GlooProcessGroup, PassesTheConformanceSuiteOverTcp) {
  for (int n = 1; n <= 4; ++n) {
    testing::run_gloo_ranks(
        n,
        [n](int, std::shared_ptr<ProcessGroup> group) {
          EXPECT_EQ(group->backend(), "gloo");
          EXPECT_EQ(group->size(), n);
          testing::expect_conformance(*group);
        },
        /*shared_memory=*/false);
  }
}

TEST(GlooProcessGroup, CollectivesCheckTheirArguments) {
  spawn(2, [](int, ProcessGroup& group) {
    const at::Tensor t = at::ones({3});
    EXPECT_THROW_MSG(group.all_gather({t}, t), InvalidArgumentError, "1 outputs for 2 processes");
    EXPECT_THROW_MSG(group.all_gather({t, at::ones({4})}, t), InvalidArgumentError, "outputs[1] must be a CPU tensor of shape [3]");
    EXPECT_THROW_MSG(group.all_to_all_single(at::ones({3}), at::ones({3})), InvalidArgumentError, "split into 2 equal chunks");
    EXPECT_THROW_MSG(group.reduce(t, 5), InvalidArgumentError, "root 5 is outside [0, 2)");
  });
}

TEST(GlooProcessGroup, SeveralOperationsInFlight) {
  spawn(3, [](int rank, ProcessGroup& group) {
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 5; ++i) {
      tensors.push_back(at::full({1000}, rank * 10 + i, at::kFloat));
      works.push_back(group.all_reduce(tensors.back()));
    }
    for (int i = 4; i >= 0; --i) works[i]->wait();  // any order
    for (int i = 0; i < 5; ++i) EXPECT_EQ(tensors[i][0].item<float>(), 30.0f + 3 * i);
    EXPECT_TRUE(works[0]->is_completed());
  });
}

TEST(GlooProcessGroup, CoalescedListsOfMixedTypes) {
  for (int n : {1, 2, 3}) {
    spawn(n, [n](int rank, ProcessGroup& group) {
      // Mixed dtypes, a non-contiguous member and bfloat16 (widened for the reduction).
      std::vector<at::Tensor> tensors = {at::full({5}, rank, at::kFloat), at::full({2, 3}, rank + 1, at::kLong),
                                         at::full({3, 4}, 2 * rank, at::kDouble).t(),
                                         at::full({4}, rank, at::kBFloat16), at::full({1}, 1.0, at::kFloat)};
      group.all_reduce_coalesced(tensors)->wait();
      const int sum = n * (n - 1) / 2;
      EXPECT_TRUE(at::equal(tensors[0], at::full({5}, sum, at::kFloat)));
      EXPECT_TRUE(at::equal(tensors[1], at::full({2, 3}, sum + n, at::kLong)));
      EXPECT_TRUE(at::equal(tensors[2], at::full({4, 3}, 2 * sum, at::kDouble)));
      EXPECT_TRUE(at::equal(tensors[3], at::full({4}, sum, at::kBFloat16)));
      EXPECT_TRUE(at::equal(tensors[4], at::full({1}, n, at::kFloat)));
      // broadcast_coalesced from the last rank.
      std::vector<at::Tensor> params = {at::full({3}, rank, at::kFloat), at::full({2, 2}, -rank, at::kLong),
                                        at::full({7}, rank * 0.5, at::kFloat)};
      group.broadcast_coalesced(params, n - 1)->wait();
      EXPECT_TRUE(at::equal(params[0], at::full({3}, n - 1, at::kFloat)));
      EXPECT_TRUE(at::equal(params[1], at::full({2, 2}, 1 - n, at::kLong)));
      EXPECT_TRUE(at::equal(params[2], at::full({7}, (n - 1) * 0.5, at::kFloat)));
    });
  }
}

TEST(GlooProcessGroup, SendAndRecvInBothDirectionsWithoutDeadlock) {
  spawn(2, [](int rank, ProcessGroup& group) {
    const int peer = 1 - rank;
    // Each sends to the other before receiving: a blocking send would deadlock here.
    at::Tensor out = at::arange(1 << 20, at::kFloat) + rank;  // 4 MiB, more than socket buffers
    at::Tensor in = at::zeros({1 << 20});
    auto sent = group.send(out, peer);
    auto received = group.recv(in, peer);
    received->wait(20s);
    sent->wait(20s);
    EXPECT_TRUE(at::equal(in, at::arange(1 << 20, at::kFloat) + peer));
    // Tags keep streams apart, each stream is in order, and a non-contiguous recv works.
    if (rank == 0) {
      group.send(at::full({3}, 1.0), 1, /*tag=*/7)->wait();
      group.send(at::full({3}, 2.0), 1, /*tag=*/7)->wait();
      group.send(at::full({3}, 9.0), 1, /*tag=*/3)->wait();
    } else {
      at::Tensor a = at::zeros({3}), b = at::zeros({3}), c = at::zeros({3, 2}).select(1, 0);
      auto wc = group.recv(c, 0, 3);
      auto wa = group.recv(a, 0, 7);
      auto wb = group.recv(b, 0, 7);
      wa->wait(20s), wb->wait(20s), wc->wait(20s);
      EXPECT_EQ(a[0].item<float>(), 1.0f);
      EXPECT_EQ(b[0].item<float>(), 2.0f);
      EXPECT_TRUE(at::equal(c, at::full({3}, 9.0)));
    }
    // Collectives still match up after point-to-point traffic.
    at::Tensor t = at::ones({4});
    group.all_reduce(t)->wait();
    EXPECT_EQ(t[0].item<float>(), 2.0f);
  });
}

TEST(GlooProcessGroup, PointToPointChecksItsArguments) {
  spawn(2, [](int rank, ProcessGroup& group) {
    const at::Tensor t = at::ones({3});
    EXPECT_THROW_MSG(group.send(t, 2), InvalidArgumentError, "peer rank 2 is outside [0, 2)");
    EXPECT_THROW_MSG(group.recv(t, rank), InvalidArgumentError, "is the peer itself");
    EXPECT_THROW_MSG(group.send(t, 1 - rank, -1), InvalidArgumentError, "tag -1 must not be negative");
  });
}

TEST(GlooProcessGroup, ARecvWithoutASenderTimesOut) {
  testing::ThreadJobStore job(30s);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      const std::shared_ptr<Store> store = job.join(rank);
      auto group = new_gloo_process_group(store, rank, 2, {"127.0.0.1", 1s});
      if (rank == 1) {
        at::Tensor t = at::zeros({3});
        const auto start = std::chrono::steady_clock::now();
        EXPECT_THROW_MSG(group->recv(t, 0)->wait(), Error, "recv(from 0, tag 0) on rank 1 of 2");
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
        store->set("done", std::string("1"));
      } else {
        store->get("done");  // the store lives on rank 0 until rank 1 is done
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Note [SIGPIPE and Gloo]: Gloo's sends raise SIGPIPE when the peer is gone, so making a group
// ignores it (as Python does for PyTorch), unless the program handles SIGPIPE itself.
void count_sigpipe(int) {}
TEST(GlooProcessGroup, MakingAGroupIgnoresSigpipeUnlessTheProgramHandlesIt) {
  struct sigaction saved {};
  ::sigaction(SIGPIPE, nullptr, &saved);
  auto after_a_group = [](void (*before)(int)) {
    ::signal(SIGPIPE, before);
    spawn(1, [](int, ProcessGroup&) {});
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    return now.sa_handler;
  };
  EXPECT_TRUE(after_a_group(SIG_DFL) == SIG_IGN) << "SIGPIPE still ends the process";
  EXPECT_TRUE(after_a_group(count_sigpipe) == count_sigpipe) << "the program's own handler was replaced";
  ::sigaction(SIGPIPE, &saved, nullptr);
}

TEST(GlooProcessGroup, RejectsWhatItCannotDo) {
  spawn(1, [](int, ProcessGroup& group) {
    at::Tensor ints = at::ones({2}, at::kInt);
    EXPECT_THROW_MSG(group.all_reduce(ints, ReduceOp::kAvg), InvalidArgumentError, "avg needs a floating-point");
    EXPECT_THROW_MSG(group.broadcast(ints, 1), InvalidArgumentError, "root 1 is outside [0, 1)");
    at::Tensor bools = at::ones({2}, at::kBool);
    EXPECT_THROW_MSG(group.all_reduce(bools)->wait(), InvalidArgumentError, "not supported");
  });
  EXPECT_THROW_MSG(new_gloo_process_group(std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, "", 5s}), 2, 2),
                   InvalidArgumentError, "rank 2 is outside [0, 2)");
}

// A peer killed mid-job makes the others fail within the timeout, naming the operation and
// the peer (`names_it`: how the survivors' error names rank 2).
void kill_a_peer_mid_job(bool shared_memory, const std::string& names_it) {
  const testing::TempDir dir("gloo");
  const std::string url = "file://" + dir.path() + "/store";
  const auto start = std::chrono::steady_clock::now();
  const std::vector<detail::ChildExit> exits = detail::fork_ranks(
      3,
      [&](int rank) {
        Rendezvous rdzv = rendezvous(url, rank, 3, 30s, no_env);
        auto group = new_gloo_process_group(rdzv.store, rank, 3, {"127.0.0.1", 20s, shared_memory});
        at::Tensor t = at::ones({16});
        group->all_reduce(t)->wait();  // all three together once
        // Rank 2 dies only once every rank has its result: killed earlier, with bytes of the
        // first all_reduce still unread on its sockets, its kernel resets the connections,
        // and a survivor still reading that all_reduce loses data already sent to it.
        rdzv.store->set("first done/" + std::to_string(rank), std::string("1"));
        if (rank == 2) {
          rdzv.store->wait({"first done/0", "first done/1"});
          ::raise(SIGKILL);
        }
        try {
          group->all_reduce(t)->wait();
          return 10;  // must not succeed without rank 2
        } catch (const CommError& e) {
          // The operation and the dead peer, by rank.
          const std::string what = e.what();
          if (what.find("all_reduce(sum) on rank") != std::string::npos && what.find(names_it) != std::string::npos) {
            return 0;
          }
          std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
          return 11;
        } catch (const TimeoutError& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
          return 12;
        }
      },
      "kill_a_peer_mid_job");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 25s);
  EXPECT_EQ(exits[2].signal, SIGKILL);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(exits[i].exit_code, 0) << "rank " << i << " (10: succeeded, 11: unclear message, 12: timeout, 1: other)";
  }
}

// Over TCP, the survivors learn which rank is gone by a roll call through the store.
TEST(GlooProcessGroup, AKilledPeerFailsTheOthersInsteadOfHanging) {
  kill_a_peer_mid_job(/*shared_memory=*/false, "Rank 2 did not report this failure");
}

// In shared memory, the survivors see its process exit while they wait for it.
TEST(GlooProcessGroup, AKilledPeerFailsTheOthersInSharedMemoryToo) {
  kill_a_peer_mid_job(/*shared_memory=*/true, "Rank 2 (process ");
}

// Note [Aborting a gloo group]: a member stopped mid-job (SIGSTOP: its connections stay
// open) holds the others' collective until the group's timeout, unless they abort the
// group, as the survivors of a fault-tolerant job do (datapar/ft/): then the collective in
// flight fails at once on every survivor, and every operation issued later throws without
// waiting. Rank 2 stops after a first all_reduce; rank 0 kills it at the end.
// Rank 0, which survives, serves the store (a member stopped while holding a file store's
// lock would stop the others' store calls too); the test starts no thread before it forks.
void abort_with_a_stopped_peer(bool shared_memory) {
  const ReservedPort port("127.0.0.1");
  const std::vector<detail::ChildExit> exits = detail::fork_ranks(
      3,
      [&](int rank) {
        const auto store = std::make_shared<TcpStore>(
            TcpStoreOptions{"127.0.0.1", port.port(), rank == 0, "abort-test", 30s, ""});
        // A timeout far beyond the test's bound: only the abort can end the collective.
        auto group = new_gloo_process_group(store, rank, 3, {"127.0.0.1", 120s, shared_memory});
        at::Tensor t = at::ones({1 << 16});
        group->all_reduce(t)->wait();
        store->set("pid/" + std::to_string(rank), std::to_string(::getpid()));
        if (rank == 2) {
          ::raise(SIGSTOP);
          return 0;  // not reached: rank 0 kills it
        }
        std::shared_ptr<Work> work = group->all_reduce(t);
        std::this_thread::sleep_for(1s);
        if (work->is_completed()) return 10;  // completed without rank 2
        const auto aborted_at = std::chrono::steady_clock::now();
        group->abort();
        group->abort();  // idempotent
        try {
          work->wait();
          return 11;
        } catch (const CommError& e) {
          if (std::string(e.what()).find("the group was aborted") == std::string::npos) {
            std::fprintf(stderr, "rank %d: in flight: %s\n", rank, e.what());
            return 12;
          }
        }
        if (std::chrono::steady_clock::now() - aborted_at > 5s) return 13;  // waited instead of failing
        try {
          group->barrier();
          return 14;
        } catch (const CommError& e) {
          if (std::string(e.what()).find("barrier on rank " + std::to_string(rank) + " of 3") == std::string::npos ||
              std::string(e.what()).find("the group was aborted") == std::string::npos) {
            std::fprintf(stderr, "rank %d: issued later: %s\n", rank, e.what());
            return 15;
          }
        }
        if (!group->aborted()) return 16;
        // Gloo's own thread was released too (Note [Aborting a gloo group]): destroying the
        // group does not wait for its timeout.
        const auto destroyed_from = std::chrono::steady_clock::now();
        group.reset();
        if (std::chrono::steady_clock::now() - destroyed_from > 5s) return 17;
        store->set("done/" + std::to_string(rank), std::string("1"));
        if (rank == 0) {
          store->wait({"done/1"});
          const Bytes pid = store->get("pid/2");
          ::kill(std::stoi(std::string(pid.begin(), pid.end())), SIGKILL);
        }
        return 0;
      },
      "abort_with_a_stopped_peer");
  EXPECT_EQ(exits[2].signal, SIGKILL);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(exits[i].exit_code, 0) << "rank " << i << " (10: completed without rank 2, 11: no error, 12: unclear "
                                     << "error, 13: failed late, 14/15: a later operation did not fail at once, "
                                     << "16: aborted() false, 17: destroying it waited, 1: other)";
  }
}

TEST(GlooProcessGroup, AbortFailsTheCollectiveInFlightAtOnce) { abort_with_a_stopped_peer(/*shared_memory=*/false); }

TEST(GlooProcessGroup, AbortFailsTheCollectiveInFlightAtOnceInSharedMemory) {
  abort_with_a_stopped_peer(/*shared_memory=*/true);
}

}  // namespace
}  // namespace datapar
